"""A tokenizer and its chat template: render, tokenize and splice prompts (no torch).

`ChatTemplate` is the prompt side of every backend: the transformers backend and the vLLM
proxy build prompts with it, so both apply the same on-policy prefix splice
(`nemogym_sdk.serve.chat.build_prompt_ids`) with the same tokenizer.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

from jinja2 import TemplateError

from nemogym_sdk.errors import ConfigError
from nemogym_sdk.serve.chat import build_prompt_ids, developer_as_system
from nemogym_sdk.serve.errors import BadRequestError

__all__ = ["ChatTemplate", "eos_ids_of"]


def eos_ids_of(tokenizer: Any, generation_eos: Any = None) -> frozenset[int]:
    """Every EOS id: the tokenizer's plus the generation config's (an int or a list)."""
    eos: set[int] = set()
    for source in (tokenizer.eos_token_id, generation_eos):
        if isinstance(source, int) and not isinstance(source, bool):
            eos.add(source)
        elif isinstance(source, list):
            eos.update(t for t in source if isinstance(t, int))
    return frozenset(eos)


class ChatTemplate:
    """A fast tokenizer with a chat template, and the EOS ids that end a turn."""

    def __init__(self, tokenizer: Any, *, eos_token_ids: Collection[int], name: str) -> None:
        """Wrap ``tokenizer``; ``eos_token_ids`` must not be empty."""
        if getattr(tokenizer, "chat_template", None) is None:
            raise ConfigError(f"The tokenizer of {name} has no chat template.")
        if not eos_token_ids:
            raise ConfigError(f"{name} defines no EOS token id.")
        self.tokenizer: Any = tokenizer
        self.eos_token_ids: frozenset[int] = frozenset(eos_token_ids)
        """Every token id that ends a generation."""
        primary = tokenizer.eos_token_id
        self.eos_token_id: int = primary if isinstance(primary, int) else min(self.eos_token_ids)
        """The tokenizer's own EOS (what a scripted turn ends with)."""
        self._token_texts: dict[int, str] = {}

    @classmethod
    def from_pretrained(cls, path: str | Path) -> ChatTemplate:
        """Load the tokenizer of a local model directory (EOS ids from its generation config)."""
        from transformers import AutoTokenizer

        directory = Path(path)
        if not directory.is_dir():
            raise FileNotFoundError(f"Model directory not found: {directory}")
        tokenizer = AutoTokenizer.from_pretrained(directory)
        generation_eos = None
        config_path = directory / "generation_config.json"
        if config_path.is_file():
            generation_eos = json.loads(config_path.read_text()).get("eos_token_id")
        return cls(
            tokenizer, eos_token_ids=eos_ids_of(tokenizer, generation_eos), name=str(directory)
        )

    def encode(self, text: str, *, add_special_tokens: bool = False) -> list[int]:
        """Tokenize plain text."""
        return list(self.tokenizer.encode(text, add_special_tokens=add_special_tokens))

    def decode(self, token_ids: Sequence[int]) -> str:
        """Detokenize, skipping special tokens (as vLLM does for ``content``)."""
        return str(self.tokenizer.decode(list(token_ids), skip_special_tokens=True))

    def token_text(self, token_id: int) -> str:
        """Return one token decoded on its own (special tokens spelled out)."""
        text = self._token_texts.get(token_id)
        if text is None:
            text = str(self.tokenizer.decode([token_id], skip_special_tokens=False))
            self._token_texts[token_id] = text
        return text

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Mapping[str, Any]] | None,
        add_generation_prompt: bool,
        continue_final_message: bool,
        chat_template_kwargs: Mapping[str, Any] | None = None,
    ) -> list[int]:
        """Render ``messages`` through the chat template and tokenize (no splice); a
        ``developer`` message the template has no place for is a system one, as in vLLM."""
        template = self.tokenizer.chat_template
        try:
            text = self.tokenizer.apply_chat_template(
                developer_as_system(messages, template if isinstance(template, str) else ""),
                tools=[dict(t) for t in tools] if tools else None,
                tokenize=False,
                add_generation_prompt=add_generation_prompt,
                continue_final_message=continue_final_message,
                **dict(chat_template_kwargs or {}),
            )
        except (TemplateError, ValueError, TypeError, KeyError) as error:
            raise BadRequestError(f"Chat template error: {error}") from error
        return self.encode(str(text))

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

        def render(
            msgs: Sequence[Mapping[str, Any]],
            /,
            *,
            add_generation_prompt: bool,
            continue_final_message: bool,
        ) -> list[int]:
            return self.render(
                msgs,
                tools=tools,
                add_generation_prompt=add_generation_prompt,
                continue_final_message=continue_final_message,
                chat_template_kwargs=chat_template_kwargs,
            )

        return build_prompt_ids(
            messages,
            render,
            self.eos_token_ids,
            add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message,
        )
