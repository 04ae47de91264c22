"""Build a family's fast tokenizer and tiny random model, and cache both on disk.

`family_model_dir` is what servers and trainers load: a directory with ``config.json``,
weights, ``generation_config.json``, ``tokenizer.json`` and the chat template, built once per
(family, seed, builder version, ranks file) and then reused, so a suite pays the ~5 s of
building once per machine. The cache root is ``$NEMOGYM_FAMILY_MODELS``, else
``$XDG_CACHE_HOME/nemogym_sdk/family-models`` (``~/.cache/...``).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nemogym_sdk._cache import user_cache
from nemogym_sdk._filelock import exclusive
from nemogym_sdk.serve.families.family import Architecture, Family
from nemogym_sdk.serve.families.vocab import (
    Vocabulary,
    bpe_tokenizer,
    ranks_path,
    require_vocab_deps,
)
from nemogym_sdk.serve.tiny import TINY_SHAPE, seeded_model

if TYPE_CHECKING:
    from tokenizers import Tokenizer
    from transformers import PreTrainedModel, PreTrainedTokenizerFast

__all__ = [
    "build_family_model",
    "build_record",
    "cached_bpe",
    "cached_dir",
    "build_family_tokenizer",
    "cache_root",
    "family_model_dir",
    "save_family",
]

_BUILDER_VERSION = 2
"""Bumped when what a build writes changes: older cache entries are then not reused."""
_DONE = "nemogym-family.json"
"""Written last into a cached directory: its presence means the build completed."""


_BPE_FORMAT = 1
"""Bumped when what `bpe_tokenizer` builds changes: older cached BPEs are then not read."""
_CONVERTED: dict[Vocabulary, str] = {}
"""Each vocabulary's converted BPE (``tokenizers`` JSON), once read or built in this process."""


def cached_bpe(vocabulary: Vocabulary) -> Tokenizer:
    """`bpe_tokenizer` (a new object each call: the caller adds its tokens), converted once
    per machine: the conversion (~2-3 s) is kept as ``tokenizers`` JSON under `cache_root`,
    keyed by the ranks file, the split pattern, this format and the ``tokenizers`` and
    ``transformers`` versions that converted it, then read back (~0.5-1 s), in this process
    from memory."""
    require_vocab_deps()
    import tokenizers
    import transformers
    from tokenizers import Tokenizer

    text = _CONVERTED.get(vocabulary)
    if text is None:
        digest = hashlib.sha256(ranks_path(vocabulary).read_bytes())
        for part in (vocabulary.pattern, tokenizers.__version__, transformers.__version__):
            digest.update(part.encode())
        digest.update(str(_BPE_FORMAT).encode())
        path = cache_root() / "bpe" / f"{vocabulary.file_name}-{digest.hexdigest()[:16]}.json"
        try:
            text = path.read_text()
        except OSError:
            text = bpe_tokenizer(vocabulary).to_str()
            path.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False) as out:
                out.write(text)
            os.replace(out.name, path)  # whole or absent: a reader never sees half of it
        _CONVERTED[vocabulary] = text
    return Tokenizer.from_str(text)


def build_family_tokenizer(family: Family) -> PreTrainedTokenizerFast:
    """The family's fast tokenizer: its BPE, added tokens at their ids, template, EOS, pad."""
    from tokenizers import AddedToken, processors
    from transformers import PreTrainedTokenizerFast

    backend = cached_bpe(family.vocabulary)
    for token in family.added_tokens:  # one at a time: each takes the next id
        backend.add_tokens([AddedToken(token.text, special=token.special, normalized=False)])
        if backend.token_to_id(token.text) != token.id:
            raise ValueError(f"{family.name}: {token.text!r} did not land at id {token.id}")
    if family.bos_token is not None:  # as the published tokenizers: BOS before plain text
        bos = (family.bos_token, family.token_id(family.bos_token))
        backend.post_processor = processors.Sequence(
            [
                processors.ByteLevel(trim_offsets=False),
                processors.TemplateProcessing(
                    single=f"{bos[0]} $A", pair=f"{bos[0]} $A {bos[0]} $B:1", special_tokens=[bos]
                ),
            ]
        )
    tokenizer = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=backend,
        bos_token=family.bos_token,
        eos_token=family.eos_token,
        pad_token=family.pad_token,
        additional_special_tokens=[t.text for t in family.added_tokens if t.special],
        model_max_length=131072,
        clean_up_tokenization_spaces=False,
    )
    tokenizer.chat_template = family.chat_template
    return tokenizer


def build_family_model(family: Family, seed: int = 0) -> PreTrainedModel:
    """The family's tiny causal LM (`TINY_SHAPE`, the family's architecture, vocabulary size
    and token ids), random weights drawn from ``seed`` (fp32, eval mode).

    The global torch RNG is left untouched.
    """
    require_vocab_deps()
    from transformers import (
        LlamaConfig,
        LlamaForCausalLM,
        Qwen2Config,
        Qwen2ForCausalLM,
        Qwen3Config,
        Qwen3ForCausalLM,
    )

    config_class, model_class = {
        Architecture.LLAMA: (LlamaConfig, LlamaForCausalLM),
        Architecture.QWEN2: (Qwen2Config, Qwen2ForCausalLM),
        Architecture.QWEN3: (Qwen3Config, Qwen3ForCausalLM),
    }[family.architecture]
    config = config_class(
        vocab_size=family.vocab_size,
        bos_token_id=family.token_id(family.bos_token or family.pad_token),
        eos_token_id=list(family.generation_eos),
        pad_token_id=family.token_id(family.pad_token),
        **TINY_SHAPE,
    )
    model: PreTrainedModel = seeded_model(model_class, config, seed)
    return model


def save_family(directory: str | Path, family: Family, seed: int = 0) -> Path:
    """Write the family's tiny model and tokenizer (with its template) to ``directory``."""
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    model: Any = build_family_model(family, seed)
    model.save_pretrained(path)
    build_family_tokenizer(family).save_pretrained(path)
    return path


def cache_root() -> Path:
    """``$NEMOGYM_FAMILY_MODELS``, else ``$XDG_CACHE_HOME/nemogym_sdk/family-models``."""
    return user_cache("NEMOGYM_FAMILY_MODELS", "family-models")


def _key(family: Family, seed: int, extra: tuple[str, ...]) -> str:
    """What a build depends on: the family record, its template, the ranks, the seed, the
    builder's version and ``extra`` (what else the caller's build depends on)."""
    digest = hashlib.sha256()
    parts = (repr(family), family.chat_template, str(seed), str(_BUILDER_VERSION), *extra)
    for part in parts:
        digest.update(part.encode())
    digest.update(ranks_path(family.vocabulary).read_bytes())
    return digest.hexdigest()[:16]


def cached_dir(
    family: Family,
    seed: int,
    build: Callable[[Path], dict[str, Any]],
    *,
    extra_key: tuple[str, ...] = (),
    root: str | Path | None = None,
    label: str = "",
) -> Path:
    """``<root>/<family>[-label]-seed<seed>-<key>``, made by ``build(directory)`` the first
    time (its returned record is kept as the completion stamp), then reused.

    Concurrent builders (pytest-xdist workers, several runs) build once: the others wait on a
    lock file beside the directory, then use it. The build happens in a temporary directory
    renamed into place, so a build killed halfway leaves nothing that looks finished.
    """
    base = Path(root) if root is not None else cache_root()
    name = f"{family.name}-{label}" if label else family.name
    target = base / f"{name}-seed{seed}-{_key(family, seed, extra_key)}"
    if (target / _DONE).is_file():
        return target
    base.mkdir(parents=True, exist_ok=True)
    with exclusive(base / f".{target.name}.lock"):
        if (target / _DONE).is_file():  # another builder finished while this one waited
            return target
        _build_into(target, base, name, build, {"family": family.name, "seed": seed})
    return target


def _build_into(
    target: Path,
    base: Path,
    name: str,
    build: Callable[[Path], dict[str, Any]],
    stamp: dict[str, Any],
) -> None:
    scratch = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=base))
    try:
        record = {**stamp, **build(scratch)}
        (scratch / _DONE).write_text(json.dumps(record) + "\n")
        if target.exists():  # a directory whose stamp was removed by hand: built again
            shutil.rmtree(target)
        scratch.rename(target)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def build_record(directory: str | Path) -> dict[str, Any]:
    """What the build of a cached directory recorded (``family``, ``seed``, and the rest)."""
    record: dict[str, Any] = json.loads((Path(directory) / _DONE).read_text())
    return record


def family_model_dir(family: Family, seed: int = 0, *, root: str | Path | None = None) -> Path:
    """The cached directory of ``family``'s tiny model at ``seed``, built on first use."""

    def build(directory: Path) -> dict[str, Any]:
        save_family(directory, family, seed)
        return {}

    return cached_dir(family, seed, build, root=root)
