"""What `ServeEngine` needs from a model backend, and the records backends return (no torch).

Two backends implement `ModelBackend`: `nemogym_sdk.serve.backend.CausalLMBackend` (a
transformers model in process, synchronous) and `nemogym_sdk.serve.vllm_backend.VllmBackend`
(a token-in/token-out proxy in front of a vLLM server, asynchronous). Both render and splice
prompts locally with the same `nemogym_sdk.serve.template.ChatTemplate`, so the token history
NeMo Gym carries between turns is exact whichever of them generates.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal, Protocol

import attrs

from nemogym_sdk.serve.protocol import TokenLogprob

__all__ = [
    "LOGPROBS_MODES",
    "MASKED_LOGPROB",
    "Generation",
    "finite_logprob",
    "LogprobsMode",
    "ModelBackend",
]

LogprobsMode = Literal["raw_logprobs", "processed_logprobs"]
LOGPROBS_MODES: tuple[LogprobsMode, ...] = ("raw_logprobs", "processed_logprobs")
"""The logprob modes `nemogym_sdk.serve` offers (vLLM's names)."""

MASKED_LOGPROB = -9999.0
"""How a ``-inf`` logprob (a token outside the top-k/top-p support) is reported, as in vLLM."""


def finite_logprob(logprob: float) -> float:
    """A logprob JSON can carry: ``-inf`` (outside the sampling support) becomes -9999.0."""
    return logprob if logprob > MASKED_LOGPROB else MASKED_LOGPROB


@attrs.frozen(kw_only=True)
class Generation:
    """What one model call produced."""

    tokens: tuple[TokenLogprob, ...]
    """Generated tokens with their logprobs, EOS included when the model stopped on it."""
    finish_reason: str
    """``"stop"`` or ``"length"``."""
    stop_reason: str | int | None = None
    """The stop string or stop token id that ended generation (``None`` for EOS or length)."""
    text_end: int | None = None
    """Cut the decoded text here (a stop string begins there); ``None`` = keep all."""

    @property
    def token_ids(self) -> list[int]:
        """The generated token ids."""
        return [t.token_id for t in self.tokens]


class ModelBackend(Protocol):
    """The tokenizer-side surface every backend offers (prompts, ``/tokenize``, decoding)."""

    name_or_path: str
    max_model_len: int
    tokenizer: Any

    def encode(self, text: str, *, add_special_tokens: bool = False) -> list[int]:
        """Tokenize plain text."""
        ...

    def decode(self, token_ids: Sequence[int]) -> str:
        """Detokenize, skipping special tokens."""
        ...

    def prompt_ids(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        chat_template_kwargs: Mapping[str, Any] | None = None,
    ) -> list[int]:
        """Return the prompt for ``messages`` with the on-policy prefix splice applied."""
        ...

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Mapping[str, Any]] | None,
        add_generation_prompt: bool,
        continue_final_message: bool,
        chat_template_kwargs: Mapping[str, Any] | None = None,
    ) -> list[int]:
        """Render ``messages`` through the chat template and tokenize (no splice)."""
        ...
