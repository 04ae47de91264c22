"""NeMo Gym's JSON wire format: the only module that spells its field names.

``decode_run_result`` turns an agent's ``/run`` result (raw JSON bytes or an already
decoded dict) into a ``RunResult``: the handful of fields a trainer needs, with every
turn's token arrays as numpy arrays. The bytes path parses with simdjson and copies
each token array straight into numpy, without building Python lists; this is where
parsing spends its time, because every turn repeats the whole history in
``prompt_token_ids``.

Decoding never raises on malformed input: problems are reported in ``RunResult.invalid``.
"""

from __future__ import annotations

import json
import math
import re
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import attrs
import numpy as np
import numpy.typing as npt
import simdjson

__all__ = ["ModelTurn", "RunResult", "decode_run_result"]

# Field names of NeMo Gym's /run result.
RESPONSE = "response"
OUTPUT = "output"
REWARD = "reward"
ERROR = "error"
MASK_SAMPLE = "mask_sample"
REWARD_COMPONENTS = "reward_components"
PROMPT_TOKEN_IDS = "prompt_token_ids"
GENERATION_TOKEN_IDS = "generation_token_ids"
GENERATION_LOG_PROBS = "generation_log_probs"
ITEM_TYPE = "type"
FUNCTION_CALL = "function_call"
MESSAGE = "message"
CONTENT = "content"
OUTPUT_TEXT = "output_text"
TEXT = "text"


_INT64 = np.dtype(np.int64)


@attrs.frozen(kw_only=True, eq=False)
class ModelTurn:
    """One model call's token data, from the output item that carries it.

    Token ids are kept as raw native ``int64`` bytes: prefix checks are then a
    ``bytes.startswith`` (a memcmp, no copy), and arrays are zero-copy views.
    """

    output_index: int
    """Index of the item in ``response.output``."""
    prompt: bytes | None
    """``prompt_token_ids`` as int64 bytes; None when missing or malformed."""
    generation: bytes
    """``generation_token_ids`` as int64 bytes (non-empty)."""
    logprobs: npt.NDArray[np.float64] | None
    """``generation_log_probs``; None when missing or malformed."""

    @property
    def prompt_ids(self) -> npt.NDArray[np.int64] | None:
        """``prompt_token_ids`` as a read-only array (a view of ``prompt``)."""
        return None if self.prompt is None else np.frombuffer(self.prompt, dtype=_INT64)

    @property
    def generation_ids(self) -> npt.NDArray[np.int64]:
        """``generation_token_ids`` as a read-only array (a view of ``generation``)."""
        return np.frombuffer(self.generation, dtype=_INT64)


@attrs.frozen(kw_only=True, eq=False)
class RunResult:
    """The parts of a ``/run`` result that training needs."""

    invalid: str | None = None
    """Why the result is structurally malformed, or None."""
    error: str | None = None
    """The agent's ``error`` field, when present and not null."""
    reward: float | None = 0.0
    """``reward`` (0.0 when absent); None when present but not a finite number."""
    mask_sample: bool = False
    """The environment asked to leave the sample out."""
    reward_components: dict[str, float] = attrs.field(factory=dict)
    """Numeric entries of ``reward_components``."""
    num_output_items: int = 0
    """Length of ``response.output``."""
    has_answer: bool = False
    """The output holds a function call or a message with non-empty text."""
    turns: tuple[ModelTurn, ...] = ()
    """Model turns, in output order (items with non-empty ``generation_token_ids``)."""


def decode_run_result(response: bytes | bytearray | memoryview | str | Any) -> RunResult:
    """Decode a ``/run`` result given as raw JSON (bytes or str) or as a decoded dict."""
    if isinstance(response, (bytes, bytearray, memoryview, str)):
        return _decode_json(response)
    return _walk(response)


_PARSERS = threading.local()


def _parser() -> Any:
    """This thread's simdjson parser: reusing one keeps its buffers (allocating a parser
    per document costs as much as a third of the parse)."""
    parser = getattr(_PARSERS, "parser", None)
    if parser is None:
        parser = _PARSERS.parser = simdjson.Parser()
    return parser


def _decode_json(raw: bytes | bytearray | memoryview | str) -> RunResult:
    data = raw.encode() if isinstance(raw, str) else bytes(raw)
    try:
        try:
            document = _parser().parse(data)
        except RuntimeError:  # a proxy of the previous document is still alive somewhere
            document = simdjson.Parser().parse(data)
    except (ValueError, RuntimeError, UnicodeDecodeError) as exc:
        return RunResult(invalid=f"the response is not valid JSON ({exc})")
    try:
        return _walk(document)
    finally:
        del document  # release the parser for the next document


# --- the walk, shared by dicts and simdjson proxies --------------------------------------


def _is_object(value: Any) -> bool:
    return type(value) is simdjson.Object or isinstance(value, Mapping)


def _is_array(value: Any) -> bool:
    return type(value) in (simdjson.Array, list, tuple)


def _is_number(value: Any) -> bool:
    return type(value) in (int, float)


def _int_bytes(value: Any) -> bytes | None:
    """A JSON array of integers as native int64 bytes, or None if it is anything else."""
    if type(value) is simdjson.Array:
        try:
            raw = bytes(value.as_buffer(of_type="i"))
        except (TypeError, ValueError):
            return None
        return raw if _flat(value, len(raw) // 8) else None
    if isinstance(value, (list, tuple)):
        if not value:
            return b""
        if any(v is True or v is False for v in value):
            return None
        try:
            array = np.asarray(value)
        except (ValueError, TypeError, OverflowError):
            return None
        if array.ndim != 1 or array.dtype.kind not in "iu":
            return None
        if array.dtype.kind == "u" and array.max() > np.iinfo(np.int64).max:
            return None
        return array.astype(_INT64, copy=False).tobytes()
    return None


def _float_array(value: Any) -> npt.NDArray[np.float64] | None:
    """A 1-D float64 array from a JSON array of finite numbers, or None otherwise."""
    if type(value) is simdjson.Array:
        try:
            array = np.frombuffer(value.as_buffer(of_type="d"), dtype=np.float64)
        except (TypeError, ValueError):  # e.g. booleans mixed in
            return None
        # simdjson rejects NaN, Infinity and out-of-range numbers: no finiteness check.
        return array if _flat(value, array.shape[0]) else None
    if isinstance(value, (list, tuple)):
        if not value:
            return np.zeros(0, dtype=np.float64)
        if any(type(v) not in (int, float) for v in value):
            return None
        array = np.asarray(value, dtype=np.float64)
        return array if bool(np.isfinite(array).all()) else None
    return None


def _flat(value: Any, count: int) -> bool:
    """Whether ``as_buffer`` read a flat array (it silently flattens nested ones).

    A nested array almost always changes the element count; checking the first
    element as well catches ``[[1], [2]]``-shaped data in O(1). (simdjson indexes
    arrays in linear time, so checking every or the last element would cost as much as
    decoding the array into Python objects.)
    """
    n = len(value)
    return count == n and (n == 0 or type(value[0]) is not simdjson.Array)


def _has_text(content: Any) -> bool:
    if isinstance(content, str):
        return bool(content.strip())
    if not _is_array(content):
        return False
    for part in content:
        if _is_object(part) and part.get(ITEM_TYPE) == OUTPUT_TEXT:
            text = part.get(TEXT)
            if isinstance(text, str) and text.strip():
                return True
    return False


def _reward(top: Any) -> float | None:
    if REWARD not in top:
        return 0.0
    value = top.get(REWARD)
    if _is_number(value) and math.isfinite(value):
        return float(value)
    return None


def _components(top: Any) -> dict[str, float]:
    raw = top.get(REWARD_COMPONENTS)
    if not _is_object(raw):
        return {}
    return {str(k): float(v) for k, v in raw.items() if _is_number(v) and math.isfinite(v)}


def _walk(top: Any) -> RunResult:
    if not _is_object(top):
        return RunResult(invalid="the response is not a JSON object")
    error = top.get(ERROR)
    common: dict[str, Any] = {
        "error": None if error is None else str(error),
        "reward": _reward(top),
        "mask_sample": top.get(MASK_SAMPLE) is True,
        "reward_components": _components(top),
    }
    response = top.get(RESPONSE)
    if response is None:
        return RunResult(**common)
    if not _is_object(response):
        return RunResult(invalid="'response' is not an object", **common)
    output = response.get(OUTPUT)
    if output is None:
        return RunResult(**common)
    if not _is_array(output):
        return RunResult(invalid="'response.output' is not an array", **common)

    has_answer = False
    turns: list[ModelTurn] = []
    for index, item in enumerate(output):
        if not _is_object(item):
            return RunResult(invalid=f"output item {index} is not an object", **common)
        kind = item.get(ITEM_TYPE)
        if kind == FUNCTION_CALL or (kind == MESSAGE and _has_text(item.get(CONTENT))):
            has_answer = True
        raw_generation = item.get(GENERATION_TOKEN_IDS)
        if raw_generation is None:
            continue
        generation = _int_bytes(raw_generation)
        if generation is None:
            return RunResult(
                invalid=f"output item {index}: generation_token_ids is not an array of integers",
                **common,
            )
        if not generation:
            continue
        turns.append(
            ModelTurn(
                output_index=index,
                prompt=_int_bytes(item.get(PROMPT_TOKEN_IDS)),
                generation=generation,
                logprobs=_float_array(item.get(GENERATION_LOG_PROBS)),
            )
        )
    return RunResult(
        num_output_items=len(output),
        has_answer=has_answer,
        turns=tuple(turns),
        **common,
    )


# --- request bodies ---------------------------------------------------------------------

RESPONSES_CREATE_PARAMS = "responses_create_params"
AGENT_REF = "agent_ref"


def build_run_body(
    row: Mapping[str, Any], overrides: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The ``/run`` request body for a dataset row.

    The row is sent whole (``agent_ref``, task fields, every message of the prompt,
    tools, metadata), with ``responses_create_params`` copied, not mutated. Precedence
    inside ``responses_create_params``: a non-None value in ``overrides`` (the trainer's
    sampling parameters) wins over the row's value; a None override leaves the row's
    value alone; and keys whose value is None are dropped, so a ``None`` left by a data
    loader is never sent as a value.
    """
    body = dict(row)
    params = row.get(RESPONSES_CREATE_PARAMS)
    merged = {k: v for k, v in (params or {}).items() if v is not None}
    for key, value in (overrides or {}).items():
        if value is not None:
            merged[key] = value
    body[RESPONSES_CREATE_PARAMS] = merged
    return body


# --- Responses-API objects for /verify ---------------------------------------------------

_THINK = re.compile(r"^\s*<think>(.*?)</think>\s*", re.DOTALL)


def _message_items(text: str, index: int) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    think = _THINK.match(text)
    if think:
        summary = [{"type": "summary_text", "text": think.group(1).strip()}]
        items.append({"id": f"rs_{index}", "type": "reasoning", "summary": summary})
        text = text[think.end() :]
    if text:
        content = [{"type": "output_text", "text": text, "annotations": []}]
        items.append(
            {
                "id": f"msg_{index}",
                "type": "message",
                "role": "assistant",
                "status": "completed",
                "content": content,
            }
        )
    return items


def _chat_items(message: Mapping[str, Any], index: int) -> list[dict[str, Any]]:
    """Responses output items for one chat message of a completion."""
    role = message.get("role", "assistant")
    if role == "tool":
        output = message.get("content")
        return [
            {
                "type": "function_call_output",
                "call_id": str(message.get("tool_call_id", f"call_{index}")),
                "output": output if isinstance(output, str) else json.dumps(output),
            }
        ]
    items: list[dict[str, Any]] = []
    reasoning = message.get("reasoning_content") or message.get("reasoning")
    if isinstance(reasoning, str) and reasoning:
        summary = [{"type": "summary_text", "text": reasoning}]
        items.append({"id": f"rs_{index}", "type": "reasoning", "summary": summary})
    content = message.get("content")
    if isinstance(content, list):  # content parts
        content = "".join(str(p.get("text", "")) for p in content if isinstance(p, Mapping))
    if isinstance(content, str) and content:
        items += _message_items(content, index)
    for n, call in enumerate(message.get("tool_calls") or []):
        function = call.get("function", call) if isinstance(call, Mapping) else {}
        arguments = function.get("arguments", "{}")
        call_id = str(call.get("id") or f"call_{index}_{n}")
        items.append(
            {
                "type": "function_call",
                "id": call_id,
                "call_id": call_id,
                "name": str(function.get("name", "")),
                "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments),
                "status": "completed",
            }
        )
    return items


def build_response(
    completion: str | Sequence[Mapping[str, Any]],
    *,
    model: str,
    tools: Sequence[Any] = (),
) -> dict[str, Any]:
    """A well-formed Responses-API ``response`` object holding ``completion``.

    ``completion`` may be plain text (a leading ``<think>...</think>`` becomes a
    reasoning item), chat messages (assistant text, ``reasoning_content``,
    ``tool_calls``; ``tool`` messages become function call outputs), or Responses output
    items (dicts with a ``type``), which are used as they are.
    """
    output: list[dict[str, Any]] = []
    if isinstance(completion, str):
        output = _message_items(completion, 0)
    else:
        for index, part in enumerate(completion):
            if "type" in part and "role" not in part:
                output.append(dict(part))
            else:
                output += _chat_items(part, index)
    if not output:  # an empty answer is still a (blank) message
        output = [
            {
                "id": "msg_0",
                "type": "message",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": "", "annotations": []}],
            }
        ]
    return {
        "id": "resp_nemogym_sdk",
        "object": "response",
        "created_at": 0,
        "model": model,
        "status": "completed",
        "output": output,
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": list(tools),
    }


def build_verify_body(row: Mapping[str, Any], response: Mapping[str, Any]) -> dict[str, Any]:
    """The ``/verify`` body: the row (``responses_create_params`` with its tools, system
    prompt and metadata untouched) plus the ``response`` to score."""
    body = {k: v for k, v in row.items() if v is not None}
    body[RESPONSE] = dict(response)
    return body
