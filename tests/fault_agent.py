"""Loopback NeMo Gym servers that fail on purpose, by a deterministic plan.

``fault_agent(plan)`` is the testing kit's fake agent (``nemogym_sdk.testing.fake_agent``)
answering each row with a valid ``/run`` result (1-3 model turns whose tokens are derived
from the row's ``task_id``, so a test can tell which row a result belongs to:
``expected_rollout(task_id)``), except where ``plan`` says otherwise. A plan maps a row's
``task_id`` to a ``FaultScript``: the fault of each attempt at that row (``attempt`` counts
every request for that ``task_id``, 1-based), e.g. ``burst(Fault.HTTP_503, 2)`` fails the
first two attempts and then succeeds, and ``always(Fault.RESET)`` never answers.
``fault_resources_server(seed_plan, verify_plan)`` does the same for ``/seed_session`` and
``/verify`` with the kit's fault actions.

The servers are real aiohttp servers on 127.0.0.1 (ephemeral port, background thread);
the faults are real too: a reset is a TCP RST, a truncated body is a short body under a
longer ``Content-Length``, a stall holds the request open until the client hangs up.
Every attempt is recorded (``FaultAgent.log``), with the requests in flight at once
(``InFlight``), so tests can check retries, backoff and concurrency from the server's side.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import attrs
from aiohttp import web

from nemogym_sdk.testing.fake_agent import (
    HTTP_STATUS,
    OK_SCRIPT,
    REPEAT_IS_FINAL,
    RETRYABLE,
    AttemptRecord,
    Fault,
    FaultScript,
    InFlight,
    act,
    always,
    burst,
    fake_agent,
    serve_routes,
)
from nemogym_sdk.testing.fake_agent import FakeAgent as FaultAgent

__all__ = [
    "HTTP_STATUS",
    "OK_SCRIPT",
    "REPEAT_IS_FINAL",
    "RETRYABLE",
    "TASK_KEY",
    "AttemptRecord",
    "Expected",
    "Fault",
    "FaultAgent",
    "InFlight",
    "FaultScript",
    "always",
    "burst",
    "expected_reward",
    "expected_rollout",
    "fault_agent",
    "fault_resources_server",
    "fault_row",
    "num_turns",
    "run_result",
]

TASK_KEY = "task_id"
"""The row field that names a row for the fault plan and the expected tokens."""


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


# --- the servers --------------------------------------------------------------------------


@contextmanager
def fault_agent(
    plan: Mapping[str, FaultScript] | None = None,
    *,
    retry_after: float = 0.0,
    slow_s: float = 0.05,
    stall_s: float = 30.0,
    shared: InFlight | None = None,
) -> Iterator[FaultAgent]:
    """Run a fault-injecting agent on 127.0.0.1; rows not in ``plan`` always succeed.

    Args:
        plan: ``task_id`` -> ``FaultScript``.
        retry_after: seconds sent in ``Retry-After`` with each 429.
        slow_s: delay of a ``SLOW`` answer.
        stall_s: the longest a ``STALL`` holds a request the client keeps open.
        shared: an ``InFlight`` shared with other servers (global concurrency).
    """
    with fake_agent(
        lambda row: run_result(str(row.get(TASK_KEY))),
        plan,
        key=TASK_KEY,
        retry_after=retry_after,
        slow_s=slow_s,
        stall_s=stall_s,
        shared=shared,
    ) as agent:
        yield agent


@contextmanager
def fault_resources_server(
    seed_plan: Mapping[str, FaultScript] | None = None,
    verify_plan: Mapping[str, FaultScript] | None = None,
    *,
    retry_after: float = 0.0,
) -> Iterator[FaultAgent]:
    """A resources server whose ``/seed_session`` and ``/verify`` fail by plan.

    ``/seed_session`` sets the cookie ``session=<task_id>-<attempt>`` (a fresh one per
    seed, as a stateful environment would); ``/verify`` answers 400 unless it carries a
    ``session`` cookie, and rewards ``expected_reward(task_id)``. Every request is logged
    with its cookies (``records(path=...)``).
    """
    plans = {"/seed_session": dict(seed_plan or {}), "/verify": dict(verify_plan or {})}
    state = FaultAgent(plans=plans, retry_after=retry_after)

    async def handle(request: web.Request) -> web.StreamResponse:
        with state.counting():
            row = await request.json()
            key = str(row.get(TASK_KEY))
            record = state.begin(request, key, row)
            fault = record.fault
            if request.path == "/seed_session":
                response = await act(state, request, fault, lambda: b"{}")
                if fault in (Fault.OK, Fault.SLOW):
                    response.set_cookie("session", f"{key}-{record.attempt}")
                return response
            if "session" not in request.cookies:
                return web.json_response({"detail": "no session"}, status=400)
            verdict = {"reward": expected_reward(key), "session": request.cookies["session"]}
            return await act(state, request, fault, lambda: json.dumps(verdict).encode())

    routes = [web.post("/seed_session", handle), web.post("/verify", handle)]
    with serve_routes(routes) as url:
        state.url = url
        yield state
