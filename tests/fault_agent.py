"""Loopback NeMo Gym servers that fail on purpose, by a deterministic plan.

``fault_agent(plan)`` runs an agent whose ``POST /run`` answers a valid ``/run`` result
(1-3 model turns whose tokens are derived from the row's ``task_id``, so a test can tell
which row a result belongs to: ``expected_rollout(task_id)``), except where ``plan``
says otherwise. A plan maps a row's ``task_id`` to a ``Script``: the fault of each
attempt at that row (``attempt`` counts every request for that ``task_id``, 1-based),
e.g. ``burst(Fault.HTTP_503, 2)`` fails the first two attempts and then succeeds, and
``always(Fault.RESET)`` never answers. ``fault_resources_server(seed_plan, verify_plan)``
does the same for ``/seed_session`` and ``/verify``.

The servers are real aiohttp servers on 127.0.0.1 (ephemeral port, background thread,
``tests.fakes.serve``); the faults are real too: a reset is a TCP RST, a truncated body
is a short body under a longer ``Content-Length``, a stall holds the request open until
the client hangs up. Every attempt is recorded (``FaultAgent.log``), with the requests in
flight at once (``InFlight``), so tests can check retries, backoff and concurrency from
the server's side.
"""

from __future__ import annotations

import asyncio
import enum
import json
import socket
import struct
import threading
import time
import zlib
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import attrs
from aiohttp import web

from tests.fakes import FakeServer, serve

TASK_KEY = "task_id"
"""The row field that names a row for the fault plan and the expected tokens."""


class Fault(enum.Enum):
    """What the server does with one attempt."""

    OK = "ok"
    """A valid ``/run`` result (or ``/verify`` verdict) for the row."""
    SLOW = "slow"
    """The valid answer, after ``slow_s`` seconds."""
    HTTP_500 = "http_500"
    """500 Internal Server Error with a JSON error body."""
    HTTP_503 = "http_503"
    """503 Service Unavailable."""
    HTTP_429 = "http_429"
    """429 Too Many Requests with ``Retry-After: <retry_after>`` (seconds)."""
    HTTP_422 = "http_422"
    """422 Unprocessable Entity: a client error, never worth retrying."""
    RESET = "reset"
    """The connection is reset (TCP RST) before any byte of an answer."""
    RESET_MID_BODY = "reset_mid_body"
    """A 200 with a chunked body, reset after the first chunk."""
    TRUNCATED = "truncated"
    """A 200 whose ``Content-Length`` is larger than the bytes sent, then a clean close."""
    GARBAGE = "garbage"
    """Bytes that are not HTTP at all, then a close."""
    STALL = "stall"
    """No answer until the client gives up (bounded by ``stall_s``)."""
    NON_JSON = "non_json"
    """A 200 whose body is not JSON."""
    REDIRECT_NON_HTTP = "redirect_non_http"
    """A 307 redirect to an ``ftp://`` URL (a misconfigured proxy in front of the agent)."""


HTTP_STATUS = {Fault.HTTP_500: 500, Fault.HTTP_503: 503, Fault.HTTP_429: 429, Fault.HTTP_422: 422}

RETRYABLE = frozenset(
    {
        Fault.HTTP_500,
        Fault.HTTP_503,
        Fault.HTTP_429,
        Fault.RESET,
        Fault.RESET_MID_BODY,
        Fault.TRUNCATED,
        Fault.GARBAGE,
    }
)
"""Faults the client should retry: connection errors, 429 and 5xx."""


@attrs.frozen
class Script:
    """The fault of each attempt at one row: ``faults`` first, then ``then`` forever."""

    faults: tuple[Fault, ...] = ()
    then: Fault = Fault.OK

    def fault(self, attempt: int) -> Fault:
        """The fault of 1-based ``attempt``."""
        return self.faults[attempt - 1] if attempt <= len(self.faults) else self.then

    @property
    def permanent(self) -> bool:
        """Whether no attempt ever succeeds."""
        return self.then not in (Fault.OK, Fault.SLOW)


def burst(fault: Fault, k: int) -> Script:
    """Fail the first ``k`` attempts with ``fault``, then answer normally."""
    return Script(faults=(fault,) * k)


def always(fault: Fault) -> Script:
    """Fail every attempt with ``fault``."""
    return Script(then=fault)


OK_SCRIPT = Script()


# --- what a row's result looks like -------------------------------------------------------


def _seed(task_id: str) -> int:
    return zlib.crc32(task_id.encode())


def num_turns(task_id: str) -> int:
    """How many model turns the agent plays for ``task_id`` (1-3)."""
    return 1 + _seed(task_id) % 3


def expected_reward(task_id: str) -> float:
    """The reward the agent reports for ``task_id``."""
    return (_seed(task_id) % 100) / 100


def run_result(task_id: str) -> dict[str, Any]:
    """The NeMo Gym ``/run`` result for ``task_id``: 1-3 tool-calling model turns.

    Turn ``t`` generates ``[g + t, 3 + t]`` with ``g`` derived from the task id; the
    environment answers each tool call with one token ``50 + t``; each prompt is the
    whole history so far, as a real model server sends it.
    """
    g = 60_000 + _seed(task_id) % 50_000
    history = [1, 2, 100 + _seed(task_id) % 50_000]
    turns = num_turns(task_id)
    output: list[dict[str, Any]] = []
    for t in range(turns):
        generation = [g + t, 3 + t]
        item: dict[str, Any]
        if t == turns - 1:
            item = {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": f"done {task_id}", "annotations": []}],
            }
        else:
            item = {"type": "function_call", "call_id": f"c{t}", "name": "f", "arguments": "{}"}
        item |= {
            "prompt_token_ids": list(history),
            "generation_token_ids": generation,
            "generation_log_probs": [-0.5, -0.25 - t / 8],
        }
        output.append(item)
        history += generation
        if t < turns - 1:
            output.append({"type": "function_call_output", "call_id": f"c{t}", "output": "ok"})
            history.append(50 + t)
    return {
        TASK_KEY: task_id,
        "response": {"id": f"resp_{task_id}", "output": output},
        "reward": expected_reward(task_id),
    }


@attrs.frozen
class Expected:
    """The training arrays a correct client + parser builds from ``run_result(task_id)``."""

    prompt_ids: tuple[int, ...]
    completion_ids: tuple[int, ...]
    env_mask: tuple[int, ...]
    logprobs: tuple[float, ...]
    reward: float
    num_turns: int


def expected_rollout(task_id: str) -> Expected:
    """What ``parse_agent_response(run_result(task_id))`` must give, built independently.

    Two turns, drawn (``g`` from the task id)::

        prompt      [1 2 p]
        completion  [g 3 | 50 | g+1 4]
        env_mask    [1 1 |  0 | 1   1]
    """
    g = 60_000 + _seed(task_id) % 50_000
    completion: list[int] = []
    mask: list[int] = []
    logprobs: list[float] = []
    turns = num_turns(task_id)
    for t in range(turns):
        if t > 0:
            completion.append(50 + t - 1)
            mask.append(0)
            logprobs.append(0.0)
        completion += [g + t, 3 + t]
        mask += [1, 1]
        logprobs += [-0.5, -0.25 - t / 8]
    return Expected(
        prompt_ids=(1, 2, 100 + _seed(task_id) % 50_000),
        completion_ids=tuple(completion),
        env_mask=tuple(mask),
        logprobs=tuple(logprobs),
        reward=expected_reward(task_id),
        num_turns=turns,
    )


def fault_row(index: int, agent: str | None = None) -> dict[str, Any]:
    """A NeMo Gym dataset row named ``t<index>`` (optionally routed to ``agent``)."""
    row: dict[str, Any] = {
        TASK_KEY: f"t{index}",
        "responses_create_params": {"input": [{"role": "user", "content": f"task {index}"}]},
    }
    if agent is not None:
        row["agent_ref"] = {"type": "responses_api_agents", "name": agent}
    return row


# --- bookkeeping --------------------------------------------------------------------------


class InFlight:
    """Requests being handled right now, and the most there ever were at once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.current = 0
        self.peak = 0

    def enter(self) -> None:
        with self._lock:
            self.current += 1
            self.peak = max(self.peak, self.current)

    def leave(self) -> None:
        with self._lock:
            self.current -= 1


@attrs.frozen
class AttemptRecord:
    """One request as the server saw it."""

    path: str
    key: str
    attempt: int
    fault: Fault
    at: float
    """``time.monotonic()`` when the request arrived."""
    cookie_header: str | None
    """The raw ``Cookie`` header, if the client sent one."""
    cookies: Mapping[str, str]
    peer_port: int


@attrs.define(eq=False)
class FaultAgent:
    """A running fault-injecting server and what it saw."""

    server: FakeServer
    plans: Mapping[str, Mapping[str, Script]]
    """Path -> ``task_id`` -> ``Script``."""
    retry_after: float = 0.0
    slow_s: float = 0.05
    stall_s: float = 30.0
    in_flight: InFlight = attrs.field(factory=InFlight)
    shared: InFlight | None = None
    """Also counted here: requests in flight over several servers."""
    log: list[AttemptRecord] = attrs.field(factory=list)
    _attempts: Counter[tuple[str, str]] = attrs.field(factory=Counter)
    _lock: threading.Lock = attrs.field(factory=threading.Lock)

    @property
    def url(self) -> str:
        return self.server.url

    def begin(self, request: web.Request, key: str, cookies: Mapping[str, str]) -> AttemptRecord:
        """Count an attempt at ``key`` on this path and decide its fault."""
        peer = request.transport.get_extra_info("peername") if request.transport else None
        with self._lock:
            self._attempts[request.path, key] += 1
            attempt = self._attempts[request.path, key]
            record = AttemptRecord(
                path=request.path,
                key=key,
                attempt=attempt,
                fault=self.plans.get(request.path, {}).get(key, OK_SCRIPT).fault(attempt),
                at=time.monotonic(),
                cookie_header=request.headers.get("Cookie"),
                cookies=dict(cookies),
                peer_port=peer[1] if peer else -1,
            )
            self.log.append(record)
        return record

    def attempts(self, key: str, path: str = "/run") -> int:
        """Requests that arrived for ``key`` on ``path``."""
        with self._lock:
            return self._attempts[path, key]

    def records(self, key: str | None = None, path: str = "/run") -> list[AttemptRecord]:
        """The recorded attempts on ``path`` (for ``key`` only, when given), in arrival order."""
        with self._lock:
            return [r for r in self.log if r.path == path and key in (None, r.key)]

    def fault_counts(self, path: str = "/run") -> Counter[Fault]:
        """How many attempts on ``path`` got each fault."""
        with self._lock:
            return Counter(r.fault for r in self.log if r.path == path)


# --- the faults ---------------------------------------------------------------------------


def _reset(request: web.Request) -> None:
    """Abort the connection with a TCP RST (SO_LINGER 0) instead of a clean close."""
    transport = request.transport
    if transport is None:
        return
    sock = transport.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()


async def _stall(request: web.Request, limit: float) -> None:
    """Hold the request until the client hangs up (or ``limit`` seconds pass)."""
    stop = time.monotonic() + limit
    while time.monotonic() < stop:
        transport = request.transport
        if transport is None or transport.is_closing():
            return
        await asyncio.sleep(0.02)


async def _answer(
    state: FaultAgent, request: web.Request, fault: Fault, ok_body: Callable[[], bytes]
) -> web.StreamResponse:
    """Act out ``fault``; ``ok_body`` builds the good answer."""
    if fault in HTTP_STATUS:
        status = HTTP_STATUS[fault]
        headers = {"Retry-After": f"{state.retry_after:g}"} if fault is Fault.HTTP_429 else {}
        return web.json_response({"detail": f"injected {status}"}, status=status, headers=headers)
    if fault is Fault.RESET:
        _reset(request)
        return web.Response()  # never written: the transport is gone
    if fault is Fault.GARBAGE:
        assert request.transport is not None
        request.transport.write(b"this is not HTTP\r\n\r\n")
        request.transport.close()
        return web.Response()
    if fault is Fault.STALL:
        await _stall(request, state.stall_s)
        return web.Response(status=504)
    if fault is Fault.REDIRECT_NON_HTTP:
        return web.Response(status=307, headers={"Location": "ftp://127.0.0.1/run"})
    if fault is Fault.NON_JSON:
        return web.Response(body=b"<html>upstream says hi</html>", content_type="text/html")
    body = ok_body()
    if fault is Fault.SLOW:
        await asyncio.sleep(state.slow_s)
    if fault is Fault.TRUNCATED:
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.content_length = len(body) + 100
        await response.prepare(request)
        await response.write(body[: len(body) // 2])
        assert request.transport is not None
        request.transport.close()
        return response
    if fault is Fault.RESET_MID_BODY:
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.enable_chunked_encoding()
        await response.prepare(request)
        await response.write(body[: len(body) // 2])
        await asyncio.sleep(0.005)  # let the first chunk leave before the reset
        _reset(request)
        return response
    return web.Response(body=body, content_type="application/json")


@contextmanager
def fault_agent(
    plan: Mapping[str, Script] | None = None,
    *,
    retry_after: float = 0.0,
    slow_s: float = 0.05,
    stall_s: float = 30.0,
    shared: InFlight | None = None,
) -> Iterator[FaultAgent]:
    """Run a fault-injecting agent on 127.0.0.1; rows not in ``plan`` always succeed.

    Args:
        plan: ``task_id`` -> ``Script``.
        retry_after: seconds sent in ``Retry-After`` with each 429.
        slow_s: delay of a ``SLOW`` answer.
        stall_s: the longest a ``STALL`` holds a request the client keeps open.
        shared: an ``InFlight`` shared with other servers (global concurrency).
    """
    holder: list[FaultAgent] = []

    def routes(server: FakeServer) -> list[web.RouteDef]:
        state = FaultAgent(
            server=server,
            plans={"/run": dict(plan or {})},
            retry_after=retry_after,
            slow_s=slow_s,
            stall_s=stall_s,
            shared=shared,
        )
        holder.append(state)

        async def run(request: web.Request) -> web.StreamResponse:
            counters = [c for c in (state.in_flight, state.shared) if c is not None]
            for counter in counters:
                counter.enter()
            try:
                row = await request.json()
                key = str(row.get(TASK_KEY))
                record = state.begin(request, key, request.cookies)
                response = await _answer(
                    state, request, record.fault, lambda: json.dumps(run_result(key)).encode()
                )
                if not response.prepared:
                    # NeMo Gym keys environment state by cookie: a client that kept this
                    # one would send it with its next /run (the tests check none does).
                    response.set_cookie("session", f"{key}-{record.attempt}")
                return response
            finally:
                for counter in counters:
                    counter.leave()

        return [web.post("/run", run)]

    with serve(routes) as server:
        (state,) = holder
        assert state.server is server
        yield state


@contextmanager
def fault_resources_server(
    seed_plan: Mapping[str, Script] | None = None,
    verify_plan: Mapping[str, Script] | None = None,
    *,
    retry_after: float = 0.0,
) -> Iterator[FaultAgent]:
    """A resources server whose ``/seed_session`` and ``/verify`` fail by plan.

    ``/seed_session`` sets the cookie ``session=<task_id>-<attempt>`` (a fresh one per
    seed, as a stateful environment would); ``/verify`` answers 400 unless it carries a
    ``session`` cookie, and rewards ``expected_reward(task_id)``. Every request is logged
    with its cookies (``records(path=...)``).
    """
    holder: list[FaultAgent] = []
    plans = {"/seed_session": dict(seed_plan or {}), "/verify": dict(verify_plan or {})}

    def routes(server: FakeServer) -> list[web.RouteDef]:
        state = FaultAgent(server=server, plans=plans, retry_after=retry_after)
        holder.append(state)

        async def handle(request: web.Request) -> web.StreamResponse:
            state.in_flight.enter()
            try:
                row = await request.json()
                key = str(row.get(TASK_KEY))
                record = state.begin(request, key, request.cookies)
                fault = record.fault
                if request.path == "/seed_session":
                    response = await _answer(state, request, fault, lambda: b"{}")
                    if fault in (Fault.OK, Fault.SLOW):
                        response.set_cookie("session", f"{key}-{record.attempt}")
                    return response
                if "session" not in request.cookies:
                    return web.json_response({"detail": "no session"}, status=400)
                verdict = {"reward": expected_reward(key), "session": request.cookies["session"]}
                return await _answer(state, request, fault, lambda: json.dumps(verdict).encode())
            finally:
                state.in_flight.leave()

        return [web.post("/seed_session", handle), web.post("/verify", handle)]

    with serve(routes) as server:
        (state,) = holder
        assert state.server is server
        yield state
