"""A generated turn to a chat message, as vLLM 0.32's chat server builds it with
``--reasoning-parser`` and ``--enable-auto-tool-choice --tool-call-parser``.

`OutputParsers` names the two parsers with vLLM's names and composes them as vLLM's
``DelegatingParser`` does: the reasoning parser splits the text first, the tool-call parser
reads what is left, and the request's ``tool_choice`` decides what reaches the message
(``vllm/parser/abstract_parser.py``, ``vllm/entrypoints/openai/chat_completion/serving.py``).
A proxy that answers with the same message as vLLM lets NeMo Gym see the same turn whether
it talks to vLLM or to us; ``tests/serve/test_parsers.py`` checks it against vLLM's own
parsers.

Decoding is the caller's: the text is the generation decoded without special tokens and
without the EOS that ended it. (vLLM decodes with the special tokens where a parser asks
for them and the Qwen3 engine then drops them again; our text differs from vLLM's only
where a special token other than a terminal sits in the middle of a ``hermes`` turn.)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from nemogym_sdk.errors import ConfigError
from nemogym_sdk.serve.parsers.json_calls import (
    ToolCallsFound,
    hermes_tool_calls,
    llama3_json_tool_calls,
)
from nemogym_sdk.serve.parsers.qwen3_engine import qwen3_reasoning, qwen3_xml_tool_calls
from nemogym_sdk.serve.parsers.think_tags import deepseek_r1_reasoning
from nemogym_sdk.serve.tools import ToolCall

__all__ = ["REASONING_PARSERS", "TOOL_CALL_PARSERS", "OutputParsers", "ParsedTurn"]

REASONING_PARSERS = ("deepseek_r1", "qwen3")
"""vLLM ``--reasoning-parser`` names this server reads."""
TOOL_CALL_PARSERS = ("hermes", "llama3_json", "qwen3_coder", "qwen3_xml")
"""vLLM ``--tool-call-parser`` names this server reads (``qwen3_xml`` is ``qwen3_coder``)."""
_ENGINE_BASED = frozenset({"qwen3", "qwen3_coder", "qwen3_xml"})


@attrs.frozen(kw_only=True)
class ParsedTurn:
    """The assistant message of one generated turn, and why the turn ended."""

    reasoning: str | None
    content: str | None
    tool_calls: tuple[ToolCall, ...]
    finish_reason: str
    """``"tool_calls"`` when an ``auto`` (or ``required``) turn called tools, else the
    generation's own (``"stop"``, ``"length"``)."""


def _known(name: str | None, known: tuple[str, ...], flag: str) -> str | None:
    if name is not None and name not in known:
        raise ConfigError(f"{flag} {name!r} is not one this server reads: {', '.join(known)}")
    return name


def _reasoning_parser(name: str | None) -> str | None:
    return _known(name, REASONING_PARSERS, "--reasoning-parser")


def _tool_call_parser(name: str | None) -> str | None:
    return _known(name, TOOL_CALL_PARSERS, "--tool-call-parser")


@attrs.frozen(kw_only=True)
class OutputParsers:
    """vLLM's ``--reasoning-parser`` and ``--tool-call-parser`` (``None``: off; a tool-call
    parser means ``--enable-auto-tool-choice``)."""

    reasoning: str | None = attrs.field(default=None, converter=_reasoning_parser)
    tool_calls: str | None = attrs.field(default="hermes", converter=_tool_call_parser)

    @property
    def engine_based(self) -> bool:
        """Every configured parser is one of vLLM's declarative engine parsers (Qwen3)."""
        names = [n for n in (self.reasoning, self.tool_calls) if n is not None]
        return bool(names) and all(n in _ENGINE_BASED for n in names)

    def refusal(self, tool_choice: Any) -> str | None:
        """vLLM's 400 message for a request whose ``tool_choice`` needs a tool-call parser
        this server runs without (``None`` when the request is fine)."""
        if self.tool_calls is not None or tool_choice in (None, "none"):
            return None
        if tool_choice == "auto":
            return (
                '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser '
                "to be set"
            )
        if isinstance(tool_choice, Mapping):
            function = tool_choice.get("function")
            name = function.get("name") if isinstance(function, Mapping) else None
            return f'tool_choice=function "{name}" requires --tool-call-parser to be set'
        return f'tool_choice="{tool_choice}" requires --tool-call-parser to be set'

    def split_reasoning(
        self, text: str, chat_template_kwargs: Mapping[str, Any]
    ) -> tuple[str | None, str | None]:
        """``(reasoning, content)`` by the reasoning parser (``(None, text)`` without one)."""
        if self.reasoning == "deepseek_r1":
            return deepseek_r1_reasoning(text)
        if self.reasoning == "qwen3":
            thinking = bool(chat_template_kwargs.get("enable_thinking", True))
            return qwen3_reasoning(text, thinking=thinking)
        return None, text

    def find_tool_calls(
        self, content: str, tools: Sequence[Mapping[str, Any]] | None, *, suppress: bool
    ) -> ToolCallsFound:
        """The tool-call parser on ``content`` (``suppress``: ``tool_choice`` is ``none``).

        Where vLLM's own parser fails on a turn (a ``qwen3_coder`` call named by a number),
        vLLM answers with an error; here the turn keeps its text and calls nothing."""
        if self.tool_calls == "hermes":
            return hermes_tool_calls(content)
        if self.tool_calls == "llama3_json":
            return llama3_json_tool_calls(content)
        try:
            return qwen3_xml_tool_calls(
                content, tools, suppress=suppress, after_reasoning_parser=self.reasoning is not None
            )
        except ValueError:
            return False, [], content

    def parse(
        self,
        text: str,
        *,
        tools: Sequence[Mapping[str, Any]] | None,
        tool_choice: Any,
        chat_template_kwargs: Mapping[str, Any] | None = None,
    ) -> tuple[str | None, str | None, list[ToolCall] | None]:
        """``(reasoning, content, tool_calls)`` as vLLM's ``DelegatingParser.parse`` gives
        them; ``tool_choice`` is the request's after vLLM's default (``"auto"`` with tools,
        ``"none"`` without). ``tool_calls`` is ``None`` where vLLM's is."""
        reasoning, content = self.split_reasoning(text, chat_template_kwargs or {})
        if self.tool_calls is None:
            return reasoning, content, []
        if tool_choice == "none":
            if self.engine_based:
                _, _, left = self.find_tool_calls(content or "", tools, suppress=bool(tools))
                return reasoning, left, []
            return reasoning, content, []
        forced = tool_choice == "required" or isinstance(tool_choice, Mapping)
        called, calls, left = self.find_tool_calls(content or "", tools, suppress=False)
        if called:
            return reasoning, (None if left is not None and not left.strip() else left), calls
        if forced and (content is None or not content.strip()):
            return reasoning, None, []
        if self.engine_based:
            return reasoning, left or None, None
        return reasoning, content, None

    def turn(
        self,
        text: str,
        *,
        finish_reason: str,
        tools: Sequence[Mapping[str, Any]] | None,
        tool_choice: Any,
        chat_template_kwargs: Mapping[str, Any] | None = None,
        include_reasoning: bool = True,
        parallel_tool_calls: bool | None = None,
    ) -> ParsedTurn:
        """The message vLLM's chat server answers with for ``text``
        (``chat_completion_full_generator``): which calls reach it, its content, the
        finish reason, ``parallel_tool_calls=False`` keeping the first call only."""
        reasoning, content, calls = self.parse(
            text, tools=tools, tool_choice=tool_choice, chat_template_kwargs=chat_template_kwargs
        )
        if not include_reasoning:
            reasoning = None
        found = tuple(calls or ())
        named = isinstance(tool_choice, Mapping)
        required = tool_choice == "required"
        kept: tuple[ToolCall, ...] = ()
        auto_called = False
        if self.tool_calls is None and not named and not required:
            pass
        elif named or required:
            content, kept = content or "", found
        elif tool_choice in (None, "none"):
            pass
        elif tools and tool_choice == "auto":
            kept, auto_called = found, bool(found)
        if parallel_tool_calls is False:
            kept = kept[:1]
        ends_with_calls = auto_called or (required and finish_reason == "stop")
        return ParsedTurn(
            reasoning=reasoning,
            content=content,
            tool_calls=kept,
            finish_reason="tool_calls" if ends_with_calls else finish_reason,
        )
