"""Tool-call parsing from generated text, and schema-satisfying example arguments."""

from __future__ import annotations

import glob
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nemogym_sdk.serve.tools import (
    example_arguments,
    example_value,
    format_tool_call,
    parse_tool_calls,
    tool_function,
)
from tests.require import absent

REPO = Path(__file__).resolve().parents[2]
GYM_PYTHON = REPO / ".venv-gym" / "bin" / "python"
GYM_SITE = REPO / ".venv-gym" / "lib" / "python3.13" / "site-packages"


def test_text_without_tool_calls_is_content() -> None:
    """Plain text stays content, unchanged, with no calls."""
    assert parse_tool_calls("It is cold.") == ("It is cold.", [])
    assert parse_tool_calls("") == ("", [])


def test_one_tool_call_is_parsed_into_openai_shape() -> None:
    """A well-formed block becomes a tool call with JSON-string arguments; content becomes None."""
    content, calls = parse_tool_calls(format_tool_call("get_weather", {"city": "SF"}))
    assert content is None
    assert len(calls) == 1
    call = calls[0].to_openai()
    assert call["type"] == "function"
    assert call["id"].startswith("chatcmpl-tool-")
    assert call["function"] == {"name": "get_weather", "arguments": '{"city": "SF"}'}


def test_the_text_before_the_calls_is_the_content() -> None:
    """Two calls plus surrounding text: both calls parsed; the content is the text before the
    first, unstripped, as vLLM's hermes parser gives it (the text after the calls is lost)."""
    text = "Let me check.\n" + format_tool_call("a", {}) + "\n" + format_tool_call("b", {"n": 1})
    content, calls = parse_tool_calls(text + " done")
    assert content == "Let me check.\n"
    assert [c.name for c in calls] == ["a", "b"]
    assert json.loads(calls[1].arguments) == {"n": 1}
    assert calls[0].id != calls[1].id


@pytest.mark.parametrize(
    "text",
    [
        "<tool_call>\n{not json}\n</tool_call>",
        "<tool_call></tool_call>",
        '<tool_call>\n{"arguments": {}}\n</tool_call>',
        '<tool_call>\n{"name": "f"}\n</tool_call>',
        '<tool_call>\n{"name": "f", "parameters": {"b": 3}}\n</tool_call>',
        '<tool_call>\n{"name": 5, "arguments": {}}\n</tool_call>',
        '<tool_call>\n["f"]\n</tool_call>',
        '<tool_call>{"name": "f", "arguments": {}}</tool_call> then <tool_call>{"name": "g"',
    ],
)
def test_malformed_tool_call_text_stays_plain_content(text: str) -> None:
    """Bad JSON, an empty block, no name or a name that is not a string, no ``arguments``,
    not an object, a bad call after a good one: no calls at all, the whole text content."""
    assert parse_tool_calls(text) == (text, [])


def test_arguments_are_the_models_json_value_written_again() -> None:
    """As in vLLM: any JSON value, written by ``json.dumps`` (the model's spacing is lost),
    and a last block left open still counts."""
    _, calls = parse_tool_calls('<tool_call>{"name": "f", "arguments": "{\\"a\\": 2}"}</tool_call>')
    assert json.loads(calls[0].arguments) == '{"a": 2}'
    _, calls = parse_tool_calls('<tool_call>{"name":"g","arguments":{"b":[1,2]}}</tool_call>')
    assert calls[0].arguments == '{"b": [1, 2]}'
    content, calls = parse_tool_calls('<tool_call>\n{"name": "h", "arguments": [1]}')
    assert content is None and (calls[0].name, calls[0].arguments) == ("h", "[1]")


_json_scalar = st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=8))
_json = st.recursive(
    _json_scalar,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=8,
)


@given(
    name=st.text(min_size=1, max_size=12).filter(lambda s: "</tool_call>" not in s),
    arguments=st.dictionaries(st.text(max_size=6), _json, max_size=4),
)
def test_format_then_parse_round_trips(name: str, arguments: dict[str, Any]) -> None:
    """Whatever the name and arguments, parsing the formatted call gives them back."""
    content, calls = parse_tool_calls(format_tool_call(name, arguments))
    if "</tool_call>" in json.dumps(arguments, ensure_ascii=False):
        return  # a closing tag inside a string value ends the block early, as in vLLM
    assert content is None
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [(name, arguments)]


def test_tool_function_reads_chat_and_flat_tools() -> None:
    """Chat-form and Responses-form function tools both yield (name, parameters)."""
    params = {"type": "object"}
    assert tool_function({"type": "function", "function": {"name": "f", "parameters": params}}) == (
        "f",
        params,
    )
    assert tool_function({"type": "function", "name": "g"}) == ("g", {})
    assert tool_function({"type": "custom", "custom": {"name": "h"}}) is None


def test_example_arguments_fill_required_properties_with_their_types() -> None:
    """Required keys only, each with a value of its declared type."""
    schema = {
        "type": "object",
        "properties": {
            "city": {"type": "string"},
            "days": {"type": "integer", "minimum": 3},
            "ratio": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
            "metric": {"type": "boolean"},
            "unit": {"type": "string", "enum": ["C", "F"]},
            "note": {"type": ["string", "null"]},
            "optional": {"type": "string"},
        },
        "required": ["city", "days", "ratio", "metric", "unit", "note"],
        "additionalProperties": False,
    }
    args = example_arguments(schema)
    assert set(args) == {"city", "days", "ratio", "metric", "unit", "note"}
    assert isinstance(args["city"], str) and args["city"]
    assert args["days"] == 3
    assert 0 < args["ratio"] <= 1
    assert args["metric"] is True
    assert args["unit"] == "C"
    assert isinstance(args["note"], str)


NESTED_SCHEMA: dict[str, Any] = {
    "type": "object",
    "$defs": {
        "Point": {"type": "object", "properties": {"x": {"type": "number"}}, "required": ["x"]}
    },
    "properties": {
        "points": {"type": "array", "items": {"$ref": "#/$defs/Point"}, "minItems": 2},
        "maybe": {"anyOf": [{"type": "null"}, {"type": "integer", "multipleOf": 5, "minimum": 7}]},
        "both": {
            "allOf": [
                {"properties": {"a": {"const": "A"}}, "required": ["a"]},
                {"type": "object"},
            ]
        },
        "when": {"type": "string", "format": "date"},
        "code": {"type": "string", "minLength": 20, "maxLength": 25},
    },
    "required": ["points", "maybe", "both", "when", "code"],
}


def test_example_arguments_handle_nesting_refs_and_combinators() -> None:
    """Nested objects and arrays, $ref into $defs, anyOf with null, allOf and const."""
    args = example_arguments(NESTED_SCHEMA)
    assert args["points"] == [{"x": 0.0}, {"x": 0.0}]
    assert args["maybe"] == 10
    assert args["both"] == {"a": "A"}
    assert args["when"] == "2024-01-01"
    assert 20 <= len(args["code"]) <= 25


def test_example_value_edge_cases() -> None:
    """Defaults and examples win; empty schemas give a string; an empty tool takes no arguments."""
    assert example_value({"type": "integer", "default": 42}) == 42
    assert example_value({"type": "string", "examples": ["Paris"]}) == "Paris"
    assert example_value({"type": "integer", "maximum": -4}) == -4
    assert example_value({"type": "array", "maxItems": 0}) == []
    assert example_value(
        {"type": "array", "items": {"type": "integer"}, "minItems": 3, "uniqueItems": True}
    ) == [0, 1, 2]
    assert isinstance(example_value({}), str)
    assert example_arguments(None) == {}
    assert example_arguments({"type": "object", "properties": {}}) == {}


def _shipped_tool_schemas() -> list[dict[str, Any]]:
    schemas: dict[str, dict[str, Any]] = {}
    for path in sorted(glob.glob(str(GYM_SITE / "resources_servers/*/data/example.jsonl"))):
        with open(path) as stream:
            for line in stream:
                if not line.strip():
                    continue
                row = json.loads(line)
                for tool in (row.get("responses_create_params") or {}).get("tools") or []:
                    found = tool_function(tool)
                    if found is not None and found[1]:
                        schemas[json.dumps(found[1], sort_keys=True)] = dict(found[1])
    return list(schemas.values())


_VALIDATE = """
import json, sys
import jsonschema
pairs = json.load(sys.stdin)
bad = []
for schema, instance in pairs:
    errors = list(jsonschema.Draft202012Validator(schema).iter_errors(instance))
    if errors:
        bad.append([schema, instance, errors[0].message])
print(json.dumps(bad))
"""


def test_example_arguments_validate_against_every_shipped_gym_tool_schema() -> None:
    """Arguments for all tool schemas in NeMo Gym's example data pass jsonschema validation."""
    if not GYM_PYTHON.exists():
        absent("needs .venv-gym (jsonschema, shipped envs)")
    schemas = _shipped_tool_schemas()
    assert len(schemas) > 100
    schemas.append(NESTED_SCHEMA)
    pairs = [[schema, example_arguments(schema)] for schema in schemas]
    done = subprocess.run(
        [str(GYM_PYTHON), "-c", _VALIDATE],
        input=json.dumps(pairs),
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert json.loads(done.stdout) == []
