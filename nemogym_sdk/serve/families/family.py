"""`Family`: what makes a model family render and tokenize as its published checkpoints do.

A family is a vocabulary (`Vocabulary`), special tokens at fixed ids, a chat template (a
``.jinja`` file beside this module), the EOS ids that end a turn, a tiny architecture, and
the vLLM parsers its model cards name. The catalog is `nemogym_sdk.serve.families.catalog`.
"""

from __future__ import annotations

import enum
from importlib import resources

import attrs

from nemogym_sdk.serve.families.vocab import Vocabulary

__all__ = ["Architecture", "Family", "SpecialToken"]


class Architecture(enum.StrEnum):
    """The transformers architecture of a family's tiny model (the one its checkpoints use)."""

    LLAMA = "llama"
    QWEN2 = "qwen2"
    QWEN3 = "qwen3"


@attrs.frozen
class SpecialToken:
    """An added token at a fixed id. ``special=False`` tokens (Qwen's ``<think>``,
    ``<tool_call>``) survive ``decode(skip_special_tokens=True)``, as in the published files."""

    id: int
    text: str
    special: bool = True


@attrs.frozen(kw_only=True)
class Family:
    """One model family: tokenizer, template, EOS ids, tiny architecture and vLLM parsers."""

    name: str
    """The name ``--model-family`` takes."""
    summary: str
    """One line: which published models render this way."""
    vocabulary: Vocabulary
    added_tokens: tuple[SpecialToken, ...]
    """Every added token, ids contiguous from ``vocabulary.size``."""
    template_file: str
    """The chat template, a file in ``nemogym_sdk/serve/families/templates``."""
    eos_token: str
    """The tokenizer's EOS: what ends an assistant turn in the template."""
    pad_token: str
    bos_token: str | None = None
    generation_eos: tuple[int, ...]
    """``generation_config.eos_token_id``: every id that stops a generation."""
    architecture: Architecture
    vocab_size: int
    """Embedding rows of the model (the published configs pad past the tokenizer)."""
    reasoning_parser: str | None = None
    """vLLM ``--reasoning-parser`` (``None``: the family does not reason)."""
    tool_call_parser: str | None = None
    """vLLM ``--tool-call-parser`` (with ``--enable-auto-tool-choice``)."""
    strips_reasoning: bool = False
    """The template drops earlier turns' reasoning: the history it re-renders differs from
    what was sampled (docs/concepts/drift.md)."""

    def __attrs_post_init__(self) -> None:
        ids = [token.id for token in self.added_tokens]
        expected = list(range(self.vocabulary.size, self.vocabulary.size + len(ids)))
        if ids != expected:
            raise ValueError(f"{self.name}: added token ids must run {expected[0]}.. in order")
        texts = {token.text for token in self.added_tokens}
        roles = {"eos": self.eos_token, "pad": self.pad_token, "bos": self.bos_token}
        for role, text in roles.items():
            if text is not None and text not in texts:
                raise ValueError(f"{self.name}: the {role} token {text!r} is not an added token")
        if not set(self.generation_eos) <= set(ids) or self.token_id(self.eos_token) not in (
            self.generation_eos
        ):
            raise ValueError(f"{self.name}: generation_eos must be added ids and hold the EOS")
        if self.vocab_size < ids[-1] + 1:
            raise ValueError(f"{self.name}: vocab_size {self.vocab_size} < {ids[-1] + 1} tokens")

    @property
    def tokenizer_size(self) -> int:
        """Ids the tokenizer knows: ranks plus added tokens."""
        return self.vocabulary.size + len(self.added_tokens)

    def token_id(self, text: str) -> int:
        """The id of an added token."""
        for token in self.added_tokens:
            if token.text == text:
                return token.id
        raise KeyError(f"{self.name} has no added token {text!r}")

    @property
    def chat_template(self) -> str:
        """The template's text."""
        package = resources.files("nemogym_sdk.serve.families") / "templates"
        return (package / self.template_file).read_text(encoding="utf-8")
