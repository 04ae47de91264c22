"""Tool calls in generated text, and example arguments that satisfy a tool's JSON schema.

The text format is the Hermes/Qwen style that vLLM's ``hermes`` tool parser reads::

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "San Francisco"}}
    </tool_call>

`parse_tool_calls` turns generated text into OpenAI ``tool_calls``; `format_tool_call` writes the
same text (the tiny chat template renders assistant ``tool_calls`` identically, so a scripted turn
re-renders token for token); `example_arguments` builds arguments for any tool a NeMo Gym
environment offers. No torch here: everything is plain Python over JSON values.
"""

from __future__ import annotations

import json
import math
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

__all__ = [
    "TOOL_CALL_CLOSE",
    "TOOL_CALL_OPEN",
    "ToolCall",
    "example_arguments",
    "example_value",
    "format_tool_call",
    "parse_tool_calls",
    "tool_function",
]

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"
_MAX_DEPTH = 12
_ID_MASK = (1 << 64) - 1

_STRING_FORMATS: dict[str, str] = {
    "date": "2024-01-01",
    "date-time": "2024-01-01T00:00:00Z",
    "time": "00:00:00",
    "duration": "P1D",
    "email": "user@example.com",
    "idn-email": "user@example.com",
    "hostname": "example.com",
    "idn-hostname": "example.com",
    "ipv4": "127.0.0.1",
    "ipv6": "::1",
    "uri": "https://example.com",
    "uri-reference": "https://example.com",
    "iri": "https://example.com",
    "url": "https://example.com",
    "uuid": "00000000-0000-4000-8000-000000000000",
}


@attrs.frozen(kw_only=True)
class ToolCall:
    """One function call parsed out of generated text."""

    name: str
    """Function name."""
    arguments: str
    """Arguments as a JSON-encoded object (the OpenAI wire form)."""
    id: str = attrs.field(factory=lambda: f"chatcmpl-tool-{uuid.uuid4().int & _ID_MASK:016x}")
    """Call id, shaped like vLLM's (``chatcmpl-tool-`` and 16 hex digits)."""

    def to_openai(self) -> dict[str, Any]:
        """Return the ``choices[0].message.tool_calls[i]`` dict of a chat completion."""
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


def format_tool_call(name: str, arguments: Mapping[str, Any]) -> str:
    """Return the text a model emits to call ``name`` with ``arguments``."""
    body = json.dumps({"name": name, "arguments": dict(arguments)}, ensure_ascii=False)
    return f"{TOOL_CALL_OPEN}\n{body}\n{TOOL_CALL_CLOSE}"


def parse_tool_calls(text: str) -> tuple[str | None, list[ToolCall]]:
    """Split generated text into ``(content, tool_calls)`` as vLLM's ``hermes`` parser does
    (`nemogym_sdk.serve.parsers`): every ``<tool_call>`` block (the last may be left open)
    holds ``{"name": ..., "arguments": ...}``; one that does not parse leaves the whole text
    as content and no call. With calls, ``content`` is the text before the first block
    (``None`` if empty); text without ``<tool_call>`` is returned unchanged.
    """
    from nemogym_sdk.serve.parsers.json_calls import hermes_tool_calls

    called, calls, content = hermes_tool_calls(text)
    return (content, calls) if called else (text, [])


def tool_function(tool: Mapping[str, Any]) -> tuple[str, Mapping[str, Any]] | None:
    """Return ``(name, parameters_schema)`` of a chat tool, or ``None`` if it is not a function.

    Accepts the chat form ``{"type": "function", "function": {"name", "parameters"}}`` and the
    flat Responses form ``{"type": "function", "name", "parameters"}``.
    """
    if tool.get("type", "function") != "function":
        return None
    fn = tool.get("function", tool)
    if not isinstance(fn, Mapping):
        return None
    name = fn.get("name")
    if not isinstance(name, str) or not name:
        return None
    params = fn.get("parameters")
    return name, (params if isinstance(params, Mapping) else {})


def example_arguments(parameters: Mapping[str, Any] | None) -> dict[str, Any]:
    """Return an arguments object that satisfies the tool's ``parameters`` JSON schema.

    Honours required properties, types (including ``["string", "null"]`` unions), ``enum``,
    ``const``, ``default``, ``examples``, nested objects and arrays, ``anyOf``/``oneOf``/``allOf``,
    local ``$ref``, numeric bounds and ``multipleOf``, string length bounds and common
    ``format`` values. ``pattern`` is not solved (a fixed placeholder string is used).
    """
    if not parameters:
        return {}
    value = example_value(parameters, root=parameters)
    return value if isinstance(value, dict) else {}


def example_value(
    schema: Any, *, root: Mapping[str, Any] | None = None, name: str = "value", depth: int = 0
) -> Any:
    """Return one JSON value valid under ``schema`` (best effort for exotic keywords)."""
    if depth > _MAX_DEPTH or not isinstance(schema, Mapping):
        return "example" if schema is not False else None
    root = schema if root is None else root
    ref = schema.get("$ref")
    if isinstance(ref, str):
        target = _resolve_ref(root, ref)
        merged = {**target, **{k: v for k, v in schema.items() if k != "$ref"}}
        return example_value(merged, root=root, name=name, depth=depth + 1)
    if "const" in schema:
        return schema["const"]
    enum = schema.get("enum")
    if isinstance(enum, list) and enum:
        return next((v for v in enum if v is not None), enum[0])
    if "default" in schema:
        return schema["default"]
    examples = schema.get("examples")
    if isinstance(examples, list) and examples:
        return examples[0]
    for key in ("anyOf", "oneOf"):
        options = schema.get(key)
        if isinstance(options, list) and options:
            chosen = next((o for o in options if not _is_null_schema(o)), options[0])
            base = {k: v for k, v in schema.items() if k != key}
            merged = {**base, **chosen} if isinstance(chosen, Mapping) else base
            return example_value(merged, root=root, name=name, depth=depth + 1)
    all_of = schema.get("allOf")
    if isinstance(all_of, list) and all_of:
        return example_value(_merge_all_of(schema, all_of), root=root, name=name, depth=depth + 1)
    kind = _schema_type(schema)
    if kind == "object":
        return _example_object(schema, root, depth)
    if kind == "array":
        return _example_array(schema, root, name, depth)
    if kind == "integer":
        return _example_number(schema, integer=True)
    if kind == "number":
        return _example_number(schema, integer=False)
    if kind == "boolean":
        return True
    if kind == "null":
        return None
    return _example_string(schema, name)


def _schema_type(schema: Mapping[str, Any]) -> str:
    kind = schema.get("type")
    if isinstance(kind, list):
        non_null = [k for k in kind if k != "null"]
        kind = non_null[0] if non_null else "null"
    if isinstance(kind, str):
        return kind
    if "properties" in schema or "required" in schema or "additionalProperties" in schema:
        return "object"
    if "items" in schema or "prefixItems" in schema:
        return "array"
    return "string"


def _is_null_schema(option: Any) -> bool:
    return isinstance(option, Mapping) and option.get("type") == "null"


def _resolve_ref(root: Mapping[str, Any], ref: str) -> Mapping[str, Any]:
    if not ref.startswith("#"):
        return {}
    node: Any = root
    for part in ref[1:].split("/"):
        if not part:
            continue
        part = part.replace("~1", "/").replace("~0", "~")
        node = node.get(part) if isinstance(node, Mapping) else None
    return node if isinstance(node, Mapping) else {}


def _merge_all_of(schema: Mapping[str, Any], parts: Sequence[Any]) -> dict[str, Any]:
    merged: dict[str, Any] = {k: v for k, v in schema.items() if k != "allOf"}
    properties: dict[str, Any] = dict(merged.get("properties") or {})
    required: list[str] = list(merged.get("required") or [])
    for part in parts:
        if not isinstance(part, Mapping):
            continue
        properties.update(part.get("properties") or {})
        required.extend(r for r in part.get("required") or [] if r not in required)
        merged.update({k: v for k, v in part.items() if k not in ("properties", "required")})
    if properties:
        merged["properties"] = properties
    if required:
        merged["required"] = required
    return merged


def _example_object(schema: Mapping[str, Any], root: Mapping[str, Any], depth: int) -> Any:
    properties = schema.get("properties")
    properties = properties if isinstance(properties, Mapping) else {}
    extra = schema.get("additionalProperties")
    out: dict[str, Any] = {}
    for key in schema.get("required") or []:
        if not isinstance(key, str):
            continue
        sub = properties.get(key, extra if isinstance(extra, Mapping) else {})
        out[key] = example_value(sub, root=root, name=key, depth=depth + 1)
    min_props = schema.get("minProperties")
    if isinstance(min_props, int):
        for key, sub in properties.items():
            if len(out) >= min_props:
                break
            out.setdefault(key, example_value(sub, root=root, name=key, depth=depth + 1))
        extra_schema = extra if isinstance(extra, Mapping) else {}
        index = 1
        while len(out) < min_props and extra is not False:
            key = f"key{index}"
            if key not in out:
                out[key] = example_value(extra_schema, root=root, name=key, depth=depth + 1)
            index += 1
    return out


def _example_array(
    schema: Mapping[str, Any], root: Mapping[str, Any], name: str, depth: int
) -> Any:
    prefix = schema.get("prefixItems")
    items = schema.get("items")
    if isinstance(items, list):  # draft-04 tuple form
        prefix, items = items, schema.get("additionalItems", {})
    lo = schema.get("minItems")
    hi = schema.get("maxItems")
    count = max(lo if isinstance(lo, int) else 0, 1)
    if isinstance(hi, int):
        count = min(count, hi)
    prefix_list = list(prefix) if isinstance(prefix, list) else []
    count = max(count, min(len(prefix_list), hi) if isinstance(hi, int) else len(prefix_list))
    values: list[Any] = []
    for index in range(count):
        sub = prefix_list[index] if index < len(prefix_list) else items
        value = example_value(sub if sub is not None else {}, root=root, name=name, depth=depth + 1)
        if schema.get("uniqueItems") and value in values:
            value = _distinct(value, index)
        values.append(value)
    return values


def _distinct(value: Any, index: int) -> Any:
    if isinstance(value, str):
        return f"{value}{index}"
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return value + index
    return value


def _bounds(schema: Mapping[str, Any]) -> tuple[float | None, bool, float | None, bool]:
    lo, hi = schema.get("minimum"), schema.get("maximum")
    lo_ex, hi_ex = schema.get("exclusiveMinimum"), schema.get("exclusiveMaximum")
    lo_excl = hi_excl = False
    if isinstance(lo_ex, bool):  # draft-04 boolean form
        lo_excl = lo_ex
    elif isinstance(lo_ex, (int, float)):
        lo, lo_excl = lo_ex, True
    if isinstance(hi_ex, bool):
        hi_excl = hi_ex
    elif isinstance(hi_ex, (int, float)):
        hi, hi_excl = hi_ex, True
    low = float(lo) if isinstance(lo, (int, float)) and not isinstance(lo, bool) else None
    high = float(hi) if isinstance(hi, (int, float)) and not isinstance(hi, bool) else None
    return low, lo_excl, high, hi_excl


def _example_number(schema: Mapping[str, Any], *, integer: bool) -> int | float:
    low, low_excl, high, high_excl = _bounds(schema)
    step = schema.get("multipleOf")
    step_f = float(step) if isinstance(step, (int, float)) and step > 0 else None
    if integer:
        start = 0.0
        if low is not None:
            start = math.floor(low) + 1 if low_excl else math.ceil(low)
        elif high is not None:
            top = math.ceil(high) - 1 if high_excl else math.floor(high)
            start = min(0.0, top)
        if step_f is not None:
            start = math.ceil(start / step_f) * step_f
        return int(start)
    value = 0.0
    if low is not None:
        value = low
        if low_excl:
            value = low + (min(1.0, (high - low) / 2) if high is not None else 1.0)
    elif high is not None and (high < 0 or (high == 0 and high_excl)):
        value = high - 1.0
    if step_f is not None:
        value = math.ceil(value / step_f) * step_f
    return value


def _example_string(schema: Mapping[str, Any], name: str) -> str:
    fmt = schema.get("format")
    text = (
        _STRING_FORMATS.get(fmt, f"example {name}") if isinstance(fmt, str) else f"example {name}"
    )
    lo = schema.get("minLength")
    hi = schema.get("maxLength")
    if isinstance(lo, int) and len(text) < lo:
        text = text + "x" * (lo - len(text))
    if isinstance(hi, int) and len(text) > hi:
        text = text[:hi]
    return text
