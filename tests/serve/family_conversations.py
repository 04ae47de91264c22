"""Conversations that exercise what the families' templates do differently: system prompts,
earlier and current reasoning (in the content and as ``reasoning_content``), thinking on and
off, tool definitions, one and several tool calls, grouped tool results, non-ASCII text."""

from __future__ import annotations

from typing import Any

from .conftest import WEATHER_TOOL


def _call(name: str, arguments: dict[str, Any], index: int = 0) -> dict[str, Any]:
    function = {"name": name, "arguments": arguments}
    return {"id": f"call_{index}", "type": "function", "function": function}


def _user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def _assistant(text: str, **extra: Any) -> dict[str, Any]:
    return {"role": "assistant", "content": text, **extra}


CONVERSATIONS: dict[str, dict[str, Any]] = {
    "one-user-turn": {"messages": [_user("Hi there, 你好! ¿Qué tal? — naïve café")]},
    "system-and-earlier-reasoning": {
        "messages": [
            {"role": "system", "content": "Be brief."},
            _user("2+2?"),
            _assistant("<think>\nadd them\n</think>\n\n4"),
            _user("and 3+3?"),
        ]
    },
    "current-reasoning-in-content": {
        "messages": [_user("2+2?"), _assistant("<think>\nadd them\n</think>\n\n4")],
        "generation_prompt": False,
    },
    "current-reasoning-as-field": {
        "messages": [_user("2+2?"), _assistant("4", reasoning_content="two and two")],
        "generation_prompt": False,
    },
    "thinking-off": {"messages": [_user("hi")], "kwargs": {"enable_thinking": False}},
    "thinking-on": {"messages": [_user("hi")], "kwargs": {"enable_thinking": True}},
    "tools-offered": {
        "tools": True,
        "messages": [{"role": "system", "content": "Sys."}, _user("Weather in Paris?")],
    },
    "one-tool-call": {
        "tools": True,
        "messages": [
            _user("Weather in Paris?"),
            _assistant("Let me check.", tool_calls=[_call("get_weather", {"city": "Paris"})]),
            {"role": "tool", "tool_call_id": "call_0", "content": "sunny, 21C"},
        ],
    },
    "two-tool-calls-then-answer": {
        "tools": True,
        "several_calls": True,
        "messages": [
            _user("Weather in Paris and Rome?"),
            _assistant(
                "",
                tool_calls=[
                    _call("get_weather", {"city": "Paris"}),
                    _call("get_weather", {"city": "Rome"}, 1),
                ],
            ),
            {"role": "tool", "tool_call_id": "call_0", "content": "sunny"},
            {"role": "tool", "tool_call_id": "call_1", "content": "rain"},
            _assistant("<think>\nboth known\n</think>\n\nParis sunny, Rome rain."),
            _user("thanks"),
        ],
    },
    "reasoning-then-typed-arguments": {
        "tools": True,
        "messages": [
            _user("Weather?"),
            _assistant(
                "<think>\nneed a tool\n</think>\n\n",
                tool_calls=[
                    _call("get_weather", {"city": "Oslo", "days": 3, "hourly": True, "x": [1]})
                ],
            ),
            {"role": "tool", "tool_call_id": "call_0", "content": "cold"},
        ],
    },
}
"""name -> ``messages``, and ``tools`` (offer `WEATHER_TOOL`), ``generation_prompt`` (False:
render only without one), ``kwargs`` (template variables), ``several_calls``."""


def applies(family: str, conversation: dict[str, Any]) -> bool:
    """Whether ``family``'s published template can render ``conversation``: DeepSeek-R1's has
    no tool calls its tokenizer can spell, Llama 3.1's one tool call per turn."""
    if family == "deepseek-r1":
        return not conversation.get("tools")
    if family == "llama3":
        return not conversation.get("several_calls")
    return True


def tools_of(conversation: dict[str, Any]) -> list[dict[str, Any]] | None:
    """The tools offered in ``conversation``, if any."""
    return [WEATHER_TOOL] if conversation.get("tools") else None
