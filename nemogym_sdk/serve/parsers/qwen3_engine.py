"""Qwen3 reasoning and ``<tool_call>`` XML tool calls, read the way vLLM 0.32 reads them.

A pure-Python mirror of the non-streaming results of vLLM's engine-based Qwen3 parsers: the
reasoning parser ``qwen3`` and the tool parser ``qwen3_coder`` (alias ``qwen3_xml``). In vLLM
both are one declarative state machine (``vllm/parser/qwen3.py`` on
``vllm/parser/engine/parser_engine.py``); the serving layer first runs it as a reasoning
parser over the whole generation, then again, from plain content, as a tool parser over the
content the first run left (``DelegatingParser.parse``)::

    <think>
    reasoning
    </think>

    <tool_call>
    <function=get_weather>
    <parameter=city>
    Paris
    </parameter>
    </function>
    </tool_call>

`qwen3_reasoning` is the first run and `qwen3_xml_tool_calls` the second. The text is matched
literally against nine markers (``<think>``, ``</think>``, ``<tool_call>``, ``</tool_call>``,
``<function=``, ``</function>``, ``<parameter=``, ``</parameter>`` and ``>``), leftmost first;
everything between them is plain text whose meaning depends on the state the reader is in.
Arguments come out as ``json.dumps(..., ensure_ascii=False)`` strings, with each value
coerced to the type the request's tool schema gives it, as vLLM's ``_fix_arg_types`` does.

Inputs on which vLLM's parser itself raises (a nameless call whose JSON body names the
function with a non-string, or a number too long for ``int``) raise ``ValueError`` here.
"""

from __future__ import annotations

import enum
import json
import math
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from nemogym_sdk.serve.tools import ToolCall

__all__ = ["qwen3_reasoning", "qwen3_xml_tool_calls"]

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
CALL_OPEN = "<tool_call>"
CALL_CLOSE = "</tool_call>"
FUNCTION_OPEN = "<function="
FUNCTION_CLOSE = "</function>"
PARAMETER_OPEN = "<parameter="
PARAMETER_CLOSE = "</parameter>"
NAME_END = ">"
_MARKERS = (
    THINK_OPEN,
    THINK_CLOSE,
    CALL_OPEN,
    CALL_CLOSE,
    FUNCTION_OPEN,
    FUNCTION_CLOSE,
    PARAMETER_OPEN,
    PARAMETER_CLOSE,
    NAME_END,
)
# No marker is a prefix of another, so the leftmost match is the one vLLM's lexer takes.
_MARKER_RE = re.compile("|".join(re.escape(marker) for marker in _MARKERS))

# vLLM compiles its patterns with the ``regex`` module, whose ``\s`` (Unicode White_Space)
# leaves out U+001C..U+001F, which ``re``'s ``\s`` (str.isspace) takes in.
_SPACES = r"[^\S\x1c-\x1f]*"
_PARAMETER_RE = re.compile(
    "".join(
        (
            rf"<{_SPACES}parameter{_SPACES}={_SPACES}([^>]*)>",  # <parameter=NAME>
            r"(.*?)",  # the value, shortest
            rf"(?:<{_SPACES}/{_SPACES}parameter{_SPACES}>",  # ends at </parameter>
            rf"|(?=<{_SPACES}parameter{_SPACES}=))",  # or just before the next <parameter=
        )
    ),
    re.DOTALL,
)
_JSON_NAME_RE = re.compile(rf'"name"{_SPACES}:{_SPACES}"([^"]*)"')


def _pieces(text: str) -> Iterator[tuple[str, bool]]:
    """Split ``text`` into markers and the plain text between them: ``(piece, is_marker)``."""
    start = 0
    for match in _MARKER_RE.finditer(text):
        if match.start() > start:
            yield text[start : match.start()], False
        yield match.group(), True
        start = match.end()
    if start < len(text):
        yield text[start:], False


# ── the reasoning run ─────────────────────────────────────────────────────────────────────


def qwen3_reasoning(text: str, *, thinking: bool) -> tuple[str | None, str | None]:
    """(reasoning, content) as vLLM's `qwen3` reasoning parser's extract_reasoning gives them
    (thinking = chat_template_kwargs.get("enable_thinking", True) truthiness; when False ->
    (None, text)).

    With thinking on, the text is reasoning until the first ``</think>`` (dropped) or
    ``<tool_call>`` (kept, as the first content); every ``<think>`` before that point is
    dropped and every later ``</think>`` too. Neither part is stripped; an empty part is None.
    """
    if not thinking:
        return None, text
    reasoning: list[str] = []
    content: list[str] = []
    in_reasoning = True
    for piece, is_marker in _pieces(text):
        if in_reasoning and is_marker:
            if piece == THINK_OPEN:
                continue
            if piece in (THINK_CLOSE, CALL_OPEN):
                in_reasoning = False
                if piece == THINK_CLOSE:
                    continue
        elif is_marker and piece == THINK_CLOSE:
            continue
        (reasoning if in_reasoning else content).append(piece)
    return "".join(reasoning) or None, "".join(content) or None


# ── the tool-call run: markup to raw calls ────────────────────────────────────────────────


class _Where(enum.Enum):
    """Where the tool-call reader is: the engine's CONTENT and TOOL_* states."""

    CONTENT = enum.auto()
    PREAMBLE = enum.auto()  # after <tool_call>, before <function=
    NAME = enum.auto()  # after <function=, before >
    BODY = enum.auto()  # after <function=NAME>, before </function>
    BETWEEN = enum.auto()  # after </function>, before </tool_call>


# Markers that open a new call, and where they lead.
_CALL_OPENERS: dict[tuple[_Where, str], _Where] = {
    (_Where.CONTENT, CALL_OPEN): _Where.PREAMBLE,
    (_Where.CONTENT, FUNCTION_OPEN): _Where.NAME,
    (_Where.BETWEEN, CALL_OPEN): _Where.PREAMBLE,
    (_Where.BETWEEN, FUNCTION_OPEN): _Where.NAME,
}
# Markers that move the reader within (or out of) the current call.
_CALL_MOVES: dict[tuple[_Where, str], _Where] = {
    (_Where.PREAMBLE, CALL_CLOSE): _Where.CONTENT,
    (_Where.PREAMBLE, FUNCTION_OPEN): _Where.NAME,
    (_Where.NAME, NAME_END): _Where.BODY,
    (_Where.NAME, FUNCTION_CLOSE): _Where.BETWEEN,
    (_Where.BODY, FUNCTION_CLOSE): _Where.BETWEEN,
    (_Where.BETWEEN, CALL_CLOSE): _Where.CONTENT,
}


@dataclass
class _RawCall:
    """One call's markup as read: the text after ``<function=`` and its body."""

    name: str = ""
    body: str = ""


@dataclass
class _Reading:
    """The tool-call run's raw result."""

    before: list[str] = field(default_factory=list)  # content before the first call opened
    after: list[str] = field(default_factory=list)  # content after it (vLLM defers this)
    calls: list[_RawCall] = field(default_factory=list)


def _read_tool_markup(content: str, *, keep_think_close: bool) -> _Reading:
    """Run the tool-call state machine over ``content``, starting in plain content.

    Text in the preamble and between calls is dropped; a call still open at the end counts as
    ended. ``</think>`` in plain content is dropped unless ``keep_think_close``.
    """
    reading = _Reading()
    where = _Where.CONTENT
    for piece, is_marker in _pieces(content):
        if is_marker and (where, piece) in _CALL_OPENERS:
            reading.calls.append(_RawCall())
            where = _CALL_OPENERS[where, piece]
        elif is_marker and (where, piece) in _CALL_MOVES:
            where = _CALL_MOVES[where, piece]
        elif where is _Where.CONTENT:
            if not (is_marker and piece == THINK_CLOSE and not keep_think_close):
                (reading.after if reading.calls else reading.before).append(piece)
        elif where is _Where.NAME:
            reading.calls[-1].name += piece
        elif where is _Where.BODY:
            reading.calls[-1].body += piece
    return reading


def _announced_name(call: _RawCall) -> str:
    """The name vLLM's engine settles on while streaming the call: the text after
    ``<function=`` as is, or else the first ``"name": "..."`` string in the body."""
    if call.name:
        return call.name
    match = _JSON_NAME_RE.search(call.body)
    return match.group(1) if match else ""


# ── the tool-call run: raw calls to arguments ────────────────────────────────────────────


def _trim_one_newline(value: str) -> str:
    """Drop one newline at each end (the template writes a value on its own line)."""
    value = value.removeprefix("\n")
    return value.removesuffix("\n")


def _parameters_json(body: str) -> str:
    """The ``<parameter=NAME>VALUE</parameter>`` pairs of a call body as a JSON object of
    strings; a later duplicate overwrites the value in the first one's place, and a last
    parameter with no closing tag is lost."""
    params = {
        match.group(1): _trim_one_newline(match.group(2)) for match in _PARAMETER_RE.finditer(body)
    }
    return json.dumps(params, ensure_ascii=False)


def _name_and_arguments_from_json(body: str) -> tuple[object, str]:
    """A nameless call's fallback: read ``{"name": ..., "arguments"|"parameters": ...}``
    from the body; ``("", body)`` when it is not a JSON object."""
    stripped = body.strip()
    try:
        parsed = json.loads(stripped)
    except json.JSONDecodeError:
        return "", stripped
    if not isinstance(parsed, dict):
        return "", stripped
    name = parsed.get("name", "")
    for key in ("arguments", "parameters"):
        if key in parsed:
            value = parsed[key]
            return name, value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    rest = {key: value for key, value in parsed.items() if key != "name"}
    return name, json.dumps(rest, ensure_ascii=False)


def _finished_call(
    call: _RawCall, announced: str, tools: Sequence[Mapping[str, Any]] | None
) -> ToolCall | None:
    """The tool call vLLM builds from one raw call, or None when it has no name."""
    if not announced and not call.body:
        return None
    name: object = announced.strip()
    if not name and call.body.strip():
        name, arguments = _name_and_arguments_from_json(call.body)
    elif call.body.strip():
        arguments = _parameters_json(call.body)
    else:
        arguments = "{}"
    if not name:
        return None
    if not isinstance(name, str):  # vLLM's FunctionCall(name=...) fails validation here
        raise ValueError(f"tool call name is not a string: {name!r}")
    return ToolCall(name=name, arguments=_coerce_arguments(arguments, name, tools))


def qwen3_xml_tool_calls(
    content: str,
    tools: Sequence[Mapping[str, Any]] | None,
    *,
    suppress: bool,
    after_reasoning_parser: bool,
) -> tuple[bool, list[ToolCall], str | None]:
    """(tools_called, calls, content) as vLLM's qwen3_coder tool parser's extract_tool_calls gives
    them on `content` (the text the reasoning parser left, or the whole text when no reasoning
    parser is configured: after_reasoning_parser=False means vLLM's skip_reasoning_parsing, so
    </think> stays text). `suppress` = request.tool_choice == "none" and request.tools
    (_suppress_tool_calls). Arguments are JSON strings after the schema coercion vLLM applies
    using `tools` (chat-format tools: {"type": "function", "function": {"name", "parameters"}}).

    Tool markup never reaches the content, even when suppressed or when no call comes of it.
    Content after the first call opened is kept only when no call got a name; with calls the
    content is stripped, and whitespace-only content is dropped whenever a call was opened.
    """
    reading = _read_tool_markup(content, keep_think_close=not after_reasoning_parser)
    if suppress:
        text = "".join(reading.before) + "".join(reading.after)
        return False, [], text or None
    announced = [_announced_name(call) for call in reading.calls]
    calls = [
        finished
        for call, name in zip(reading.calls, announced, strict=True)
        if (finished := _finished_call(call, name, tools)) is not None
    ]
    text = "".join(reading.before)
    if not any(announced):
        text += "".join(reading.after)
    if reading.calls and not text.strip():
        text = ""
    if calls:
        text = text.strip()
    return bool(calls), calls, text or None


# ── schema coercion (vLLM's _fix_arg_types and coerce_to_schema_type) ─────────────────────

_TYPE_ALIASES: dict[str, str] = {
    **dict.fromkeys(("str", "text", "varchar", "char", "enum"), "string"),
    **dict.fromkeys(
        ("int", "int32", "int64", "uint", "uint32", "uint64", "long", "short", "unsigned"),
        "integer",
    ),
    **dict.fromkeys(("float", "float32", "float64", "double"), "number"),
    "bool": "boolean",
    "dict": "object",
    **dict.fromkeys(("arr", "list", "sequence"), "array"),
}
_ENUM_VALUE_TYPES: tuple[tuple[type, str], ...] = (
    (bool, "boolean"),  # before int: a bool is an int
    (int, "integer"),
    (float, "number"),
    (str, "string"),
    (list, "array"),
    (dict, "object"),
)


def _tool_properties(tools: Sequence[Mapping[str, Any]], name: str) -> object:
    """``parameters.properties`` of the first tool named ``name`` ({} when none)."""
    for tool in tools:
        function = tool.get("function") if isinstance(tool, Mapping) else None
        if isinstance(function, Mapping) and function.get("name") == name:
            parameters = function.get("parameters") or {}
            return parameters.get("properties", {}) if isinstance(parameters, Mapping) else {}
    return {}


def _coerce_arguments(arguments: str, name: str, tools: Sequence[Mapping[str, Any]] | None) -> str:
    """Re-type the values of a JSON-object argument string by the tool's schema; the string
    is re-serialised only when some value changed."""
    if not tools:
        return arguments
    try:
        parsed = json.loads(arguments)
    except ValueError:
        return arguments
    if not isinstance(parsed, dict):
        return arguments
    properties = _tool_properties(tools, name)
    if not properties or not isinstance(properties, Mapping):
        return arguments
    if _coerce_members(parsed, properties):
        return json.dumps(parsed, ensure_ascii=False)
    return arguments


def _coerce_members(values: dict[str, Any], properties: Mapping[str, Any]) -> bool:
    """Coerce, in place, each value that has a schema in ``properties``; whether any changed."""
    changed = False
    for key, value in values.items():
        schema = properties.get(key)
        if isinstance(schema, dict):
            coerced, value_changed = _coerce_value(value, schema)
            if value_changed:
                values[key] = coerced
                changed = True
    return changed


def _coerce_value(value: object, schema: dict[str, Any]) -> tuple[object, bool]:
    """(value coerced to ``schema``, whether it changed): strings by type, objects and arrays
    member by member where the schema describes them, other JSON values through their text."""
    if isinstance(value, str):
        coerced = _coerce_text(value, _schema_types(schema))
        return coerced, coerced is not value
    if isinstance(value, dict):
        nested = schema.get("properties")
        return value, isinstance(nested, dict) and _coerce_members(value, nested)
    if isinstance(value, list):
        items = schema.get("items")
        if not isinstance(items, dict):
            return value, False
        changed = False
        for index, item in enumerate(value):
            coerced, item_changed = _coerce_value(item, items)
            if item_changed:
                value[index] = coerced
                changed = True
        return value, changed
    coerced = _coerce_text(json.dumps(value, ensure_ascii=False), _schema_types(schema))
    return coerced, type(coerced) is not type(value) or coerced != value


def _schema_types(schema: object) -> set[str]:
    """Every type a schema allows: ``type`` (a name or a list), the types of its ``enum``
    values, and those of ``anyOf``/``oneOf``/``allOf`` branches; ``{"string"}`` when none."""
    if not isinstance(schema, dict):
        return {"string"}
    types: set[str] = set()
    declared = schema.get("type")
    if isinstance(declared, str):
        types.add(declared)
    elif isinstance(declared, list):
        types.update(entry for entry in declared if isinstance(entry, str))
    choices = schema.get("enum")
    if isinstance(choices, list):
        types.update(_enum_value_type(choice) for choice in choices)
        types.discard("")
    for combinator in ("anyOf", "oneOf", "allOf"):
        branches = schema.get(combinator)
        if isinstance(branches, list):
            for branch in branches:
                types.update(_schema_types(branch))
    return types or {"string"}


def _enum_value_type(choice: object) -> str:
    """The JSON type name of one ``enum`` value ("" for a value of no JSON type)."""
    if choice is None:
        return "null"
    for python_type, type_name in _ENUM_VALUE_TYPES:
        if isinstance(choice, python_type):
            return type_name
    return ""


def _coerce_text(value: str, types: set[str]) -> Any:
    """``value`` as the first of null, integer, number, boolean, object, array, string that
    the types allow and it reads as; failing all, its JSON value, or ``value`` itself."""
    wanted = {_TYPE_ALIASES.get(key, key) for key in (name.strip().lower() for name in types)}
    for type_name, read in _READERS:
        if type_name in wanted:
            found, result = read(value)
            if found:
                return result
    if "string" in wanted:  # the last choice, and a string needs no reading
        return value
    found, result = _read_json(value)
    return result if found else value


def _read_null(value: str) -> tuple[bool, Any]:
    return value.lower() == "null", None


def _read_integer(value: str) -> tuple[bool, Any]:
    try:
        return True, int(value)
    except ValueError:
        return False, None


def _read_number(value: str) -> tuple[bool, Any]:
    """A finite float, as an int when it is whole ("3.0" -> 3)."""
    try:
        number = float(value)
    except ValueError:
        return False, None
    if not math.isfinite(number):
        return False, None
    return True, number if number != int(number) else int(number)


def _read_boolean(value: str) -> tuple[bool, Any]:
    word = value.lower().strip()
    if word in ("true", "1"):
        return True, True
    if word in ("false", "0"):
        return True, False
    return False, None


def _read_json(value: str) -> tuple[bool, Any]:
    """Any JSON value that serialises back to valid JSON (no NaN or infinity inside)."""
    try:
        parsed = json.loads(value)
    except ValueError:
        return False, None
    try:
        json.dumps(parsed, allow_nan=False)
    except ValueError:
        return False, None
    return True, parsed


_READERS: tuple[tuple[str, Callable[[str], tuple[bool, Any]]], ...] = (
    ("null", _read_null),
    ("integer", _read_integer),
    ("number", _read_number),
    ("boolean", _read_boolean),
    ("object", _read_json),
    ("array", _read_json),
)
