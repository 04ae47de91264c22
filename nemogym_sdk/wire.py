"""NeMo Gym's JSON wire format: the only module that spells its field names.

``decode_run_result`` turns an agent's ``/run`` result (raw JSON bytes or an already
decoded dict) into a ``RunResult``: the handful of fields a trainer needs, with every
turn's token arrays as numpy arrays. The bytes path parses with simdjson and copies
each token array straight into numpy, without building Python lists; this is where
parsing spends its time, because every turn repeats the whole history in
``prompt_token_ids``.

Decoding never raises on malformed input: problems are reported in ``RunResult.invalid``.

The rest of NeMo Gym's names live here too, so no other module spells them: the server
types (``AGENTS``, ``RESOURCES`` ..., shared by ``directory`` and ``gym``), the routes,
the row fields (``agent_ref``, ``responses_create_params`` and its sampling keys), the
``/run`` and ``/verify`` request bodies, ``/verify`` answers (``decode_verify_result``,
with the same reward and ``reward_components`` rules as ``/run`` results) and the head
server's ``/server_instances`` entries.
"""

from __future__ import annotations

import json
import math
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, NamedTuple

import numpy as np
import numpy.typing as npt
import simdjson

__all__ = [
    "AGENTS",
    "ENVIRONMENT_SERVERS",
    "MODELS",
    "RESOURCES",
    "SERVER_TYPES",
    "ModelTurn",
    "RunResult",
    "ServerInstance",
    "VerifyAnswer",
    "agent_name",
    "decode_run_result",
    "decode_server_instance",
    "decode_verify_result",
    "row_tools",
]

# Server types: the second-level keys of NeMo Gym's global config, also reported as
# ``server_type`` by the head server's ``/server_instances``.
AGENTS = "responses_api_agents"
RESOURCES = "resources_servers"
MODELS = "responses_api_models"
ENVIRONMENT_SERVERS = "environment_servers"
SERVER_TYPES = (AGENTS, RESOURCES, MODELS, ENVIRONMENT_SERVERS)

# Routes.
RUN_ROUTE = "/run"
SEED_SESSION_ROUTE = "/seed_session"
VERIFY_ROUTE = "/verify"

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


def _reward(value: Any) -> float | None:
    if value is _MISSING:
        return 0.0
    if _is_number(value) and math.isfinite(value):
        return float(value)
    return None


def _components(raw: Any) -> dict[str, float]:
    if not _is_object(raw):
        return {}
    return {str(k): float(v) for k, v in raw.items() if _is_number(v) and math.isfinite(v)}


def _walk(top: Any) -> RunResult:
    if not _is_object(top):
        return RunResult(invalid="the response is not a JSON object")
    get = _getter(top)
    error = get(ERROR)
    common: dict[str, Any] = {
        "error": None if error is None else str(error),
        "reward": _reward(get(REWARD, _MISSING)),
        "mask_sample": get(MASK_SAMPLE) is True,
        "reward_components": _components(get(REWARD_COMPONENTS)),
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
        if not has_answer and ITEM_TYPE in keys:
            kind = item[ITEM_TYPE]
            if kind == FUNCTION_CALL or (
                kind == MESSAGE and CONTENT in keys and _has_text(item[CONTENT])
            ):
                has_answer = True
        raw_generation = item[GENERATION_TOKEN_IDS] if GENERATION_TOKEN_IDS in keys else None
        if raw_generation is None:
            continue
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
            return RunResult(
                invalid=f"output item {index}: generation_token_ids is not an array of integers",
                **common,
            )
        if not len(generation):
            continue
        turn = ModelTurn(index, prompt, generation, logprobs)
        if problem is None and (
            prompt is None
            or (not turns and not prompt)
            or logprobs is None
            or len(logprobs) != len(generation)
        ):
            problem = _turn_problem(len(turns), turn)
        turns.append(turn)
    return RunResult(
        num_output_items=len(output),
        has_answer=has_answer,
        turns=tuple(turns),
        turn_problem=problem,
        **common,
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


# --- rows and request bodies ------------------------------------------------------------

RESPONSES_CREATE_PARAMS = "responses_create_params"
AGENT_REF = "agent_ref"
NAME = "name"
TOOLS = "tools"
TEMPERATURE = "temperature"
TOP_P = "top_p"
MAX_OUTPUT_TOKENS = "max_output_tokens"


def agent_name(row: Mapping[str, Any]) -> str | None:
    """``agent_ref.name`` of a row, when it names an agent."""
    ref = row.get(AGENT_REF)
    name = ref.get(NAME) if isinstance(ref, Mapping) else None
    return name if isinstance(name, str) and name else None


def create_params(row: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """A row's ``responses_create_params`` object, or None when it has none."""
    params = row.get(RESPONSES_CREATE_PARAMS)
    return params if isinstance(params, Mapping) else None


def row_tools(row: Mapping[str, Any]) -> list[Any]:
    """The tools a row offers the model (``responses_create_params.tools``), or ``[]``."""
    params = create_params(row)
    tools = params.get(TOOLS) if params is not None else None
    return list(tools) if isinstance(tools, Sequence) and not isinstance(tools, str) else []


def sampling_overrides(
    temperature: float | None, top_p: float | None, max_output_tokens: int | None
) -> dict[str, float | int | None]:
    """Sampling parameters as ``responses_create_params`` keys (None: keep the row's)."""
    return {TEMPERATURE: temperature, TOP_P: top_p, MAX_OUTPUT_TOKENS: max_output_tokens}


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


INPUT = "input"
ROLE = "role"
_TEXT_PARTS = frozenset({"input_text", OUTPUT_TEXT, TEXT})


def input_messages(row: Mapping[str, Any]) -> list[dict[str, str]]:
    """A row's request input as chat messages ``{"role", "content"}`` with text content.

    ``responses_create_params.input`` is a string (one user message) or a list of items;
    message items keep their role, and their content, a string or a list of parts, becomes
    the text of its text parts. Items that are not messages (earlier tool calls and their
    outputs) are left out: this is the prompt as a trainer shows or samples it, while the
    row itself still travels whole to the agent.
    """
    params = create_params(row)
    raw = params.get(INPUT) if params is not None else None
    if isinstance(raw, str):
        return [{ROLE: "user", CONTENT: raw}]
    messages = []
    for item in raw if isinstance(raw, Sequence) else ():
        if not isinstance(item, Mapping) or not isinstance(item.get(ROLE), str):
            continue
        if item.get(ITEM_TYPE, MESSAGE) != MESSAGE:
            continue
        content = item.get(CONTENT)
        if isinstance(content, str):
            text = content
        elif isinstance(content, Sequence):
            text = "".join(
                str(part.get(TEXT, ""))
                for part in content
                if isinstance(part, Mapping) and part.get(ITEM_TYPE) in _TEXT_PARTS
            )
        else:
            text = ""
        messages.append({ROLE: item[ROLE], CONTENT: text})
    return messages


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


# --- /verify answers ----------------------------------------------------------------------


class VerifyAnswer(NamedTuple):
    """A decoded ``/verify`` answer."""

    invalid: str | None = None
    """Why the answer cannot be used (not JSON, no finite numeric reward), or None."""
    reward: float | None = None
    """``reward``; None when the answer is invalid."""
    reward_components: dict[str, float] = {}  # noqa: RUF012 - never mutated
    """Finite numeric entries of ``reward_components`` (as in ``/run`` results)."""
    mask_sample: bool = False
    """The environment asked to leave the sample out."""
    data: Any = None
    """The whole decoded answer."""


def decode_verify_result(body: bytes | str) -> VerifyAnswer:
    """Decode a ``/verify`` answer; never raises (problems are in ``invalid``).

    The reward must be a finite number (not a bool); ``reward_components`` keeps its
    finite numeric entries and drops the rest, exactly as ``decode_run_result`` does.
    """
    try:
        data = json.loads(body)
    except ValueError:
        preview = body[:100]
        return VerifyAnswer(invalid=f"/verify returned non-JSON {preview!r}")
    if not isinstance(data, dict):
        return VerifyAnswer(invalid="/verify returned no numeric reward", data=data)
    reward = _reward(data.get(REWARD, None))
    if reward is None:
        return VerifyAnswer(invalid="/verify returned no numeric reward", data=data)
    return VerifyAnswer(
        reward=reward,
        reward_components=_components(data.get(REWARD_COMPONENTS)),
        mask_sample=data.get(MASK_SAMPLE) is True,
        data=data,
    )


# --- the head server's /server_instances ---------------------------------------------------

PROCESS_NAME = "process_name"
RESOURCES_SERVER = "resources_server"
"""An agent config's reference to its resources server (``{"type": ..., "name": ...}``)."""
CONFIG_PATH = "config_path"
HOST = "host"
PORT = "port"
SERVER_TYPE = "server_type"


class ServerInstance(NamedTuple):
    """One entry of the head server's ``/server_instances``."""

    name: str
    """Instance name (``process_name``, else ``config_path``)."""
    server_type: str
    """``server_type`` as reported."""
    implementation: str
    """``name``: the implementation directory."""
    host: str
    """``host`` it listens on (maybe a wildcard or loopback address)."""
    port: int
    """``port`` it listens on."""


def encode_server_instance(
    instance: ServerInstance, *, url: str, dir_path: str, entrypoint: str, pid: int, started: float
) -> dict[str, Any]:
    """One ``/server_instances`` entry as NeMo Gym's head server lists it
    (``ServerInstanceDisplayConfig``): what a stack the SDK started reports."""
    return {
        PROCESS_NAME: instance.name,
        SERVER_TYPE: instance.server_type,
        NAME: instance.implementation,
        "dir_path": dir_path,
        "entrypoint": entrypoint,
        HOST: instance.host,
        PORT: instance.port,
        "url": url,
        "pid": pid,
        CONFIG_PATH: instance.name,
        "start_time": started,
    }


def decode_server_instance(entry: Any) -> ServerInstance | None:
    """One ``/server_instances`` entry, or None when it lacks a name, host or port."""
    if not isinstance(entry, Mapping):
        return None
    name = entry.get(PROCESS_NAME) or entry.get(CONFIG_PATH)
    host, port = entry.get(HOST), entry.get(PORT)
    if not (isinstance(name, str) and isinstance(host, str) and isinstance(port, int)):
        return None
    return ServerInstance(
        name=name,
        server_type=str(entry.get(SERVER_TYPE)),
        implementation=str(entry.get(NAME)),
        host=host,
        port=port,
    )
