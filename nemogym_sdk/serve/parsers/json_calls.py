"""vLLM's JSON tool-call parsers, ``hermes`` and ``llama3_json``, as their non-streaming
``extract_tool_calls`` behaves in vLLM 0.32 (``vllm/tool_parsers/hermes_tool_parser.py``,
``llama_tool_parser.py``).

Both are all or nothing: one call that does not parse leaves the whole text as content and
no call. Arguments are the model's JSON value written again by ``json.dumps(...,
ensure_ascii=False)``, so the model's own spacing is not kept (the drift that
docs/concepts/drift.md calls a re-serialised tool call).
"""

from __future__ import annotations

import json
import re
from typing import Any

from nemogym_sdk.serve.tools import ToolCall

__all__ = ["ToolCallsFound", "hermes_tool_calls", "llama3_json_tool_calls"]

ToolCallsFound = tuple[bool, list[ToolCall], str | None]
"""``(tools_called, calls, content)``: what vLLM's ``ExtractedToolCallInformation`` holds."""

_HERMES_OPEN = "<tool_call>"
_HERMES_BLOCK = re.compile(r"<tool_call>(.*?)</tool_call>|<tool_call>(.*)", re.DOTALL)
_LLAMA_BOT = "<|python_tag|>"
_DECODER = json.JSONDecoder()


def _call(found: Any, arguments_key: str | None) -> ToolCall:
    """A call from a decoded JSON object; ``KeyError``/``TypeError``/``ValueError`` where
    vLLM's own construction fails (no name, a name that is not a string, not an object)."""
    if not isinstance(found, dict):
        raise TypeError("a tool call must be a JSON object")
    name = found["name"]
    if not isinstance(name, str):
        raise TypeError("a tool call's name must be a string")
    key = arguments_key or ("arguments" if "arguments" in found else "parameters")
    return ToolCall(name=name, arguments=json.dumps(found[key], ensure_ascii=False))


def hermes_tool_calls(text: str) -> ToolCallsFound:
    """``<tool_call>{"name": ..., "arguments": ...}</tool_call>`` blocks (the last may be left
    open); the content is the text before the first block, unstripped, ``None`` if empty."""
    if _HERMES_OPEN not in text:
        return False, [], text
    try:
        calls = [
            _call(json.loads(closed or left_open), "arguments")
            for closed, left_open in _HERMES_BLOCK.findall(text)
        ]
    except (ValueError, KeyError, TypeError):
        return False, [], text
    before = text[: text.find(_HERMES_OPEN)]
    return True, calls, before or None


def llama3_json_tool_calls(text: str) -> ToolCallsFound:
    """Every JSON object in the text (each ``{`` not inside one already read) is a call with
    ``name`` and ``arguments`` (or ``parameters``); with calls, the content is ``None``."""
    if _LLAMA_BOT not in text and "{" not in text:
        return False, [], text
    calls: list[ToolCall] = []
    end = -1
    for brace in re.finditer(r"\{", text):
        if brace.start() <= end:
            continue
        try:
            found, length = _DECODER.raw_decode(text[brace.start() :])
            end = brace.start() + length
            calls.append(_call(found, None))
        except (ValueError, KeyError, TypeError):
            return False, [], text
    if calls:
        return True, calls, None
    return False, [], text
