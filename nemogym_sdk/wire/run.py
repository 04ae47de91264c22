"""``/run`` results: ``decode_run_result`` and the records it returns.

``decode_run_result`` turns an agent's ``/run`` result (raw JSON bytes or an already
decoded dict) into a ``RunResult``: the handful of fields a trainer needs, with every
turn's token arrays as numpy arrays. The bytes path parses with simdjson and copies
each token array straight into numpy, without building Python lists; this is where
parsing spends its time, because every turn repeats the whole history in
``prompt_token_ids``.

Decoding never raises on malformed input: problems are reported in ``RunResult.invalid``.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Mapping
from typing import Any, Literal, NamedTuple

import numpy as np
import numpy.typing as npt
import simdjson

from nemogym_sdk.wire.names import (
    CONTENT,
    ERROR,
    FUNCTION_CALL,
    GENERATION_LOG_PROBS,
    GENERATION_TOKEN_IDS,
    ITEM_TYPE,
    MASK_SAMPLE,
    MESSAGE,
    NG_ERROR_MESSAGE,
    NG_FAILURE_BODY,
    NG_FAILURE_CLASS,
    NG_FAILURE_HTTP_STATUS,
    NG_FAILURE_MESSAGE,
    NG_FAILURE_STAGE,
    NG_FAILURE_TERMINAL,
    NG_FAILURE_TYPE,
    OUTPUT,
    OUTPUT_TEXT,
    PROMPT_TOKEN_IDS,
    RESPONSE,
    REWARD,
    REWARD_COMPONENTS,
    ROUTED_EXPERTS,
    TEXT,
)
from nemogym_sdk.wire.versions import read_policy_version

__all__ = [
    "ModelTurn",
    "RunResult",
    "decode_run_result",
    "finite_components",
    "finite_reward",
]

_INT64 = np.dtype(np.int64)


class ModelTurn(NamedTuple):
    """One model call's token data, from the output item that carries it.

    Token arrays are kept as raw native buffers (int64 ids, float64 logprobs): prefix
    checks are then a ``bytes.startswith`` (a memcmp, no copy), segments join with
    ``bytes.join``, and arrays are zero-copy views. (A tuple, not an attrs record: one
    is built per model turn on the parser's hot path.)
    """

    output_index: int
    """Index of the item in ``response.output``."""
    prompt: bytes | None
    """``prompt_token_ids`` as int64 bytes; None when missing or malformed."""
    generation: bytes | memoryview
    """``generation_token_ids`` as an int64 buffer (non-empty)."""
    logprobs: bytes | memoryview | None
    """``generation_log_probs`` as a float64 buffer; None when missing or malformed."""
    version: int | None = None
    """The policy version that generated the turn, from the SDK sampler's
    ``routed_experts`` envelope (``nemogym_sdk.wire.versions``); None when it has none."""

    @property
    def prompt_ids(self) -> npt.NDArray[np.int64] | None:
        """``prompt_token_ids`` as a read-only array (a view of ``prompt``)."""
        return None if self.prompt is None else np.frombuffer(self.prompt, dtype=_INT64)

    @property
    def generation_ids(self) -> npt.NDArray[np.int64]:
        """``generation_token_ids`` as a read-only array (a view of ``generation``)."""
        return np.frombuffer(self.generation, dtype=_INT64)


class RunResult(NamedTuple):
    """The parts of a ``/run`` result that training needs (a tuple: one per response)."""

    invalid: str | None = None
    """Why the result is structurally malformed, or None."""
    error: str | None = None
    """The agent's ``error`` field, when present and not null."""
    reward: float | None = 0.0
    """``reward`` (0.0 when absent); None when present but not a finite number."""
    mask_sample: bool = False
    """The environment asked to leave the sample out."""
    reward_components: dict[str, float] = {}  # noqa: RUF012 - never mutated
    """Numeric entries of ``reward_components``."""
    num_output_items: int = 0
    """Length of ``response.output``."""
    has_answer: bool = False
    """The output holds a function call or a message with non-empty text."""
    turns: tuple[ModelTurn, ...] = ()
    """Model turns, in output order (items with non-empty ``generation_token_ids``)."""
    turn_problem: str | None = None
    """Why the first unusable model turn cannot be stitched (missing or empty prompt ids,
    missing logprobs, or a logprob count that differs from the token count)."""
    failure_class: str | None = None
    """NeMo Gym's ``_ng_failure_class`` when this is a failure row of its rollout collection
    (``route_failures_to_sidecar``, a drained dispatch, an environment server's failure),
    not a ``/run`` result; ``error`` then holds NeMo Gym's reason."""


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


def _simd_buffer(value: Any, of_type: Literal["i", "d"]) -> memoryview | None:
    """A flat simdjson array of numbers as a native 8-byte buffer (``of_type`` ``"i"``:
    int64, ``"d"``: float64), or None if it is anything else.

    ``as_buffer`` silently flattens nested arrays; a nested array almost always changes
    the element count, and checking the first element catches ``[[1], [2]]`` in O(1)
    (simdjson indexes arrays in linear time, so checking every element would cost as
    much as decoding into Python objects). simdjson itself rejects NaN, Infinity and
    out-of-range numbers.
    """
    try:
        buffer = memoryview(value.as_buffer(of_type=of_type))
        n = len(value)
    except (AttributeError, TypeError, ValueError):  # not an array, or wrong element types
        return None
    if buffer.nbytes == 8 * n and (not n or type(value[0]) is not simdjson.Array):
        return buffer
    return None


def _py_ints(value: Any) -> bytes | None:
    """A Python list of integers as native int64 bytes, or None if it is anything else."""
    if not isinstance(value, (list, tuple)):
        return None
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


def _py_floats(value: Any) -> bytes | None:
    """A Python list of finite numbers as native float64 bytes, or None otherwise."""
    if not isinstance(value, (list, tuple)):
        return None
    if not value:
        return b""
    if any(type(v) not in (int, float) for v in value):
        return None
    array = np.asarray(value, dtype=np.float64)
    return array.tobytes() if bool(np.isfinite(array).all()) else None


Getter = Callable[..., Any]
_MISSING = object()


def _getter(obj: Any) -> Getter:
    """``obj.get`` for a dict; for a simdjson object, a lookup through its key set.

    pysimdjson raises and catches an exception inside ``get`` and ``in`` for a missing
    key (~6 us each); one pass over the keys costs ~1 us, and most output items lack
    the token fields.
    """
    if type(obj) is simdjson.Object:
        keys = set(obj.keys())
        return lambda key, default=None: obj[key] if key in keys else default
    get: Getter = obj.get
    return get


def _has_text(content: Any) -> bool:
    if isinstance(content, str):
        return bool(content.strip())
    if not _is_array(content):
        return False
    for part in content:
        if not _is_object(part):
            continue
        get = _getter(part)
        text = get(TEXT)
        if get(ITEM_TYPE) == OUTPUT_TEXT and isinstance(text, str) and text.strip():
            return True
    return False


def finite_reward(value: Any) -> float | None:
    """A ``reward`` field: 0.0 when absent, the number when finite, else None (invalid)."""
    if value is _MISSING:
        return 0.0
    if _is_number(value) and math.isfinite(value):
        return float(value)
    return None


def finite_components(raw: Any) -> dict[str, float]:
    """The finite numeric entries of a ``reward_components`` object (others dropped)."""
    if not _is_object(raw):
        return {}
    return {str(k): float(v) for k, v in raw.items() if _is_number(v) and math.isfinite(v)}


def _walk(top: Any) -> RunResult:
    if not _is_object(top):
        return RunResult(invalid="the response is not a JSON object")
    get = _getter(top)
    failure_class = get(NG_FAILURE_CLASS)
    if failure_class is not None:
        return RunResult(error=_failure_reason(get), reward=None, failure_class=str(failure_class))
    error = get(ERROR)
    common: dict[str, Any] = {
        "error": None if error is None else str(error),
        "reward": finite_reward(get(REWARD, _MISSING)),
        "mask_sample": get(MASK_SAMPLE) is True,
        "reward_components": finite_components(get(REWARD_COMPONENTS)),
    }
    response = get(RESPONSE)
    if response is None:
        return RunResult(**common)
    if not _is_object(response):
        return RunResult(invalid="'response' is not an object", **common)
    try:  # nearly always present: a direct lookup, not a key scan
        output = response[OUTPUT]
    except KeyError:
        output = None
    if output is None:
        return RunResult(**common)
    if not _is_array(output):
        return RunResult(invalid="'response.output' is not an array", **common)
    return _walk_output(output, common)


def _failure_reason(get: Getter) -> str:
    """NeMo Gym's reason for a failure row, with what it recorded: ``NeMo Gym
    agent_run_error (HTTP 500, ClientResponseError): message; body: ...``."""
    details = [
        f"HTTP {get(NG_FAILURE_HTTP_STATUS)}" if get(NG_FAILURE_HTTP_STATUS) is not None else "",
        str(get(NG_FAILURE_TYPE) or ""),
        f"stage {get(NG_FAILURE_STAGE)}" if get(NG_FAILURE_STAGE) is not None else "",
        "terminal" if get(NG_FAILURE_TERMINAL) is True else "",
    ]
    shown = ", ".join(d for d in details if d)
    reason = f"NeMo Gym {get(NG_FAILURE_CLASS)}" + (f" ({shown})" if shown else "")
    message, body = get(NG_FAILURE_MESSAGE) or get(NG_ERROR_MESSAGE), get(NG_FAILURE_BODY)
    if message:
        reason += f": {message}"
    if body and str(body) not in str(message or ""):
        reason += f"; body: {body}"
    return reason


def _walk_output(output: Any, common: dict[str, Any]) -> RunResult:
    """The model turns and the answer of ``response.output`` (dicts or simdjson proxies)."""
    simd = type(output) is simdjson.Array
    has_answer = False
    problem: str | None = None
    turns: list[ModelTurn] = []
    for index, item in enumerate(output):
        if simd and type(item) is simdjson.Object:
            keys: Any = tuple(item.keys())  # a missing-key lookup costs a raised exception
        elif isinstance(item, Mapping):
            keys = item
        else:
            return RunResult(invalid=f"output item {index} is not an object", **common)
        has_answer = has_answer or _is_answer(item, keys)
        raw_generation = item[GENERATION_TOKEN_IDS] if GENERATION_TOKEN_IDS in keys else None
        if raw_generation is None:
            continue
        turn = _model_turn(item, keys, index, raw_generation, simd)
        if turn is None:
            invalid = f"output item {index}: generation_token_ids is not an array of integers"
            return RunResult(invalid=invalid, **common)
        if not len(turn.generation):
            continue
        if problem is None and not _stitchable(turn, first=not turns):
            problem = _turn_problem(len(turns), turn)
        turns.append(turn)
    return RunResult(
        num_output_items=len(output),
        has_answer=has_answer,
        turns=tuple(turns),
        turn_problem=problem,
        **common,
    )


def _is_answer(item: Any, keys: Any) -> bool:
    """A function call, or a message with non-empty text."""
    if ITEM_TYPE not in keys:
        return False
    kind = item[ITEM_TYPE]
    return bool(
        kind == FUNCTION_CALL or (kind == MESSAGE and CONTENT in keys and _has_text(item[CONTENT]))
    )


def _model_turn(
    item: Any, keys: Any, index: int, raw_generation: Any, simd: bool
) -> ModelTurn | None:
    """The token buffers of a model turn; None when its generation ids are not integers."""
    raw_prompt = item[PROMPT_TOKEN_IDS] if PROMPT_TOKEN_IDS in keys else None
    raw_logprobs = item[GENERATION_LOG_PROBS] if GENERATION_LOG_PROBS in keys else None
    prompt: bytes | None
    generation: bytes | memoryview | None
    logprobs: bytes | memoryview | None
    if simd:
        generation = _simd_buffer(raw_generation, "i")
        buffer = _simd_buffer(raw_prompt, "i")
        prompt = None if buffer is None else bytes(buffer)  # a startswith receiver
        logprobs = _simd_buffer(raw_logprobs, "d")
    else:
        generation = _py_ints(raw_generation)
        prompt = _py_ints(raw_prompt)
        logprobs = _py_floats(raw_logprobs)
    if generation is None:
        return None
    version = read_policy_version(item[ROUTED_EXPERTS]) if ROUTED_EXPERTS in keys else None
    return ModelTurn(index, prompt, generation, logprobs, version)


def _stitchable(turn: ModelTurn, *, first: bool) -> bool:
    """Prompt ids present (non-empty for the first turn), one logprob per generated token."""
    return not (
        turn.prompt is None
        or (first and not turn.prompt)
        or turn.logprobs is None
        or len(turn.logprobs) != len(turn.generation)
    )


def _turn_problem(number: int, turn: ModelTurn) -> str:
    """Why a model turn cannot be stitched (its buffers: int64 ids, float64 logprobs)."""
    where = f"model turn {number} (output item {turn.output_index})"
    if turn.prompt is None:
        return f"{where}: prompt_token_ids is missing or not an array of integers"
    if turn.logprobs is None:
        return f"{where}: generation_log_probs is missing or not an array of finite numbers"
    n_generated, n_logprobs = len(turn.generation) // 8, len(turn.logprobs) // 8
    if n_logprobs != n_generated:
        return f"{where}: {n_logprobs} generation_log_probs for {n_generated} generation_token_ids"
    return f"{where}: prompt_token_ids is empty"
