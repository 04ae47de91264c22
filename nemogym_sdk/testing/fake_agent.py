"""A fake NeMo Gym agent server for trainer-integration tests, with a fault plan.

``fake_agent(responses, plan=...)`` runs a real aiohttp server on 127.0.0.1 (an
ephemeral port, its own thread and event loop) whose ``POST /run`` answers each dataset
row with a ``/run`` result: from a list (served in turn), or from a function of the row.
The fault plan maps a row's key (by default its ``task_id``) to a ``FaultScript``: the fault
of each attempt at that row, e.g. ``burst(Fault.HTTP_503, 2)`` fails the first two
attempts and then answers, ``always(Fault.RESET)`` never does. The faults are real: a
reset is a TCP RST, a truncated body is a short body under a longer ``Content-Length``,
a stall holds the request open until the client hangs up. Every attempt is logged
(``FakeAgent.log``) with its cookies and the requests in flight, so a test can check
retries, backoff and concurrency from the server's side. NeMo Gym is not needed::

    with fake_agent([episode.response], plan={"t0": burst(Fault.HTTP_503, 1)}) as agent:
        rollouts = my_trainer_collects(agent.url, rows)
        assert agent.attempts("t0") == 2
"""

from __future__ import annotations

import asyncio
import enum
import itertools
import json
import socket
import struct
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import attrs
from aiohttp import web

from nemogym_sdk.testing.episodes import Episode

__all__ = [
    "HTTP_STATUS",
    "OK_SCRIPT",
    "REPEAT_IS_FINAL",
    "RETRYABLE",
    "AttemptRecord",
    "FakeAgent",
    "Fault",
    "InFlight",
    "FaultScript",
    "act",
    "always",
    "burst",
    "fake_agent",
    "serve_routes",
]


class Fault(enum.Enum):
    """What the server does with one attempt."""

    OK = "ok"
    """A valid answer for the row."""
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
"""The HTTP status of each HTTP-error fault."""

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
"""Faults a client should retry: connection errors, 429 and 5xx."""

REPEAT_IS_FINAL = frozenset({Fault.HTTP_500})
"""Retryable faults whose answer is the same on every attempt and does not say "try later":
the client stops at the first exact repeat (``RetryPolicy.retry_repeated_errors``), so a
row that always fails so costs two attempts."""


@attrs.frozen
class FaultScript:
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


def burst(fault: Fault, k: int) -> FaultScript:
    """Fail the first ``k`` attempts with ``fault``, then answer normally."""
    return FaultScript(faults=(fault,) * k)


def always(fault: Fault) -> FaultScript:
    """Fail every attempt with ``fault``."""
    return FaultScript(then=fault)


OK_SCRIPT = FaultScript()
"""Every attempt answers."""


class InFlight:
    """Requests being handled right now, and the most there ever were at once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.current = 0
        self.peak = 0

    def enter(self) -> None:
        """One more request in flight."""
        with self._lock:
            self.current += 1
            self.peak = max(self.peak, self.current)

    def leave(self) -> None:
        """One request fewer in flight."""
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
    body: Any = None
    """The request's JSON body."""


@attrs.define(eq=False)
class FakeAgent:
    """A running fake server: its URL, its fault plans and what it saw."""

    url: str = ""
    plans: Mapping[str, Mapping[str, FaultScript]] = attrs.field(factory=dict)
    """Path -> row key -> ``FaultScript``."""
    default: FaultScript = OK_SCRIPT
    """The script of rows the plan does not name."""
    retry_after: float = 0.0
    slow_s: float = 0.05
    stall_s: float = 30.0
    in_flight: InFlight = attrs.field(factory=InFlight)
    shared: InFlight | None = None
    """Also counted here: requests in flight over several servers."""
    log: list[AttemptRecord] = attrs.field(factory=list)
    _attempts: Counter[tuple[str, str]] = attrs.field(factory=Counter)
    _lock: threading.Lock = attrs.field(factory=threading.Lock)

    def begin(self, request: web.Request, key: str, body: Any = None) -> AttemptRecord:
        """Count an attempt at ``key`` on this path and decide its fault."""
        peer = request.transport.get_extra_info("peername") if request.transport else None
        with self._lock:
            self._attempts[request.path, key] += 1
            attempt = self._attempts[request.path, key]
            script = self.plans.get(request.path, {}).get(key, self.default)
            record = AttemptRecord(
                path=request.path,
                key=key,
                attempt=attempt,
                fault=script.fault(attempt),
                at=time.monotonic(),
                cookie_header=request.headers.get("Cookie"),
                cookies=dict(request.cookies),
                peer_port=peer[1] if peer else -1,
                body=body,
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

    @contextmanager
    def counting(self) -> Iterator[None]:
        """Count one request in flight (here and in ``shared``) while the block runs."""
        counters = [c for c in (self.in_flight, self.shared) if c is not None]
        for counter in counters:
            counter.enter()
        try:
            yield
        finally:
            for counter in counters:
                counter.leave()


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


async def act(
    agent: FakeAgent, request: web.Request, fault: Fault, ok_body: Callable[[], bytes]
) -> web.StreamResponse:
    """Act out ``fault`` on ``request``; ``ok_body`` builds the good answer's JSON bytes."""
    if fault in HTTP_STATUS:
        status = HTTP_STATUS[fault]
        headers = {"Retry-After": f"{agent.retry_after:g}"} if fault is Fault.HTTP_429 else {}
        return web.json_response({"detail": f"injected {status}"}, status=status, headers=headers)
    if fault is Fault.RESET:
        _reset(request)
        return web.Response()  # never written: the transport is gone
    if fault is Fault.GARBAGE:
        if request.transport is not None:
            request.transport.write(b"this is not HTTP\r\n\r\n")
            request.transport.close()
        return web.Response()
    if fault is Fault.STALL:
        await _stall(request, agent.stall_s)
        return web.Response(status=504)
    if fault is Fault.REDIRECT_NON_HTTP:
        return web.Response(status=307, headers={"Location": "ftp://127.0.0.1/run"})
    if fault is Fault.NON_JSON:
        return web.Response(body=b"<html>upstream says hi</html>", content_type="text/html")
    body = ok_body()
    if fault is Fault.SLOW:
        await asyncio.sleep(agent.slow_s)
    if fault is Fault.TRUNCATED:
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.content_length = len(body) + 100
        await response.prepare(request)
        await response.write(body[: len(body) // 2])
        if request.transport is not None:
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


# --- serving ------------------------------------------------------------------------------


@contextmanager
def serve_routes(routes: Sequence[web.RouteDef]) -> Iterator[str]:
    """Run an aiohttp app with ``routes`` on 127.0.0.1 in a background thread; yields its
    base URL and stops the server (and the thread) on exit."""
    loop = asyncio.new_event_loop()
    runners: list[web.AppRunner] = []

    async def start() -> str:
        app = web.Application()
        app.add_routes(routes)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        runners.append(runner)
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        return f"http://127.0.0.1:{runner.addresses[0][1]}"

    thread = threading.Thread(target=loop.run_forever, name="fake-nemo-gym", daemon=True)
    thread.start()
    try:
        yield asyncio.run_coroutine_threadsafe(start(), loop).result(timeout=30)
    finally:
        if runners:
            asyncio.run_coroutine_threadsafe(runners[0].cleanup(), loop).result(timeout=30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=30)
        loop.close()


ResponseSource = Sequence[Any] | Callable[[Mapping[str, Any]], Any]
"""``/run`` results served in turn (cycled), or a function of the request's row; each a
dict, raw bytes or an ``Episode``."""


def _body(value: Any) -> bytes:
    if isinstance(value, Episode):
        value = value.response
    if isinstance(value, bytes | bytearray):
        return bytes(value)
    return json.dumps(value).encode()


def _row_key(field: str) -> Callable[[Any], str]:
    def key(row: Any) -> str:
        return str(row.get(field)) if isinstance(row, dict) else "None"

    return key


@contextmanager
def fake_agent(
    responses: ResponseSource,
    plan: Mapping[str, FaultScript] | None = None,
    *,
    default: FaultScript = OK_SCRIPT,
    key: str | Callable[[Any], str] = "task_id",
    retry_after: float = 0.0,
    slow_s: float = 0.05,
    stall_s: float = 30.0,
    shared: InFlight | None = None,
    session_cookie: bool = True,
) -> Iterator[FakeAgent]:
    """Run a fake NeMo Gym agent on 127.0.0.1 whose ``POST /run`` answers from ``responses``.

    Args:
        responses: ``/run`` results served in request order (cycled), or a function of
            the row; each a dict, raw bytes or an ``Episode``.
        plan: row key -> ``FaultScript`` (the fault of each attempt at that row).
        default: the script of rows ``plan`` does not name (e.g. ``burst(Fault.RESET, 1)``
            resets the first attempt at every row).
        key: the row field that names a row for the plan (or a function of the row).
        retry_after: seconds sent in ``Retry-After`` with each 429.
        slow_s: delay of a ``SLOW`` answer.
        stall_s: the longest a ``STALL`` holds a request the client keeps open.
        shared: an ``InFlight`` shared with other servers (global concurrency).
        session_cookie: set a ``session`` cookie on each answer, as NeMo Gym does (a
            client that keeps it would send it with its next ``/run``).
    """
    if callable(responses):
        answer_for: Callable[[Mapping[str, Any]], Any] = responses
    else:
        if not responses:
            raise ValueError("fake_agent needs at least one response to serve")
        cycle = itertools.cycle(list(responses))
        cycle_lock = threading.Lock()

        def answer_for(row: Mapping[str, Any]) -> Any:
            with cycle_lock:
                return next(cycle)

    row_key = _row_key(key) if isinstance(key, str) else key
    agent = FakeAgent(
        plans={"/run": dict(plan or {})},
        default=default,
        retry_after=retry_after,
        slow_s=slow_s,
        stall_s=stall_s,
        shared=shared,
    )

    async def run(request: web.Request) -> web.StreamResponse:
        with agent.counting():
            try:
                row = await request.json()
            except ValueError:
                return web.json_response({"detail": "the body is not JSON"}, status=400)
            name = row_key(row)
            record = agent.begin(request, name, row)
            response = await act(agent, request, record.fault, lambda: _body(answer_for(row)))
            if session_cookie and not response.prepared:
                response.set_cookie("session", f"{name}-{record.attempt}")
            return response

    async def health(request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    with serve_routes([web.post("/run", run), web.get("/", health)]) as url:
        agent.url = url
        yield agent
