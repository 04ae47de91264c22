"""``AgentClient(sampler_url=...)``: every rollout carries an episode id to the sampler, and
an episode the client gives up on is aborted there (real loopback HTTP, fake servers)."""

from __future__ import annotations

import asyncio
import json
import threading

from aiohttp import web

from nemogym_sdk import AgentClient, RetryPolicy, RolloutStatus, TaskRow, Timeouts
from nemogym_sdk.testing.fake_agent import serve_routes
from nemogym_sdk.wire import EPISODE_ID, RESPONSES_CREATE_PARAMS
from nemogym_sdk.wire.affinity import EXTRA_BODY, METADATA
from tests.fault_agent import TASK_KEY, Fault, always, fault_agent, fault_row

EOS = 2


def _rows(n: int) -> list[TaskRow]:
    return [TaskRow(row_id=f"faults.jsonl:{i}", data=fault_row(i)) for i in range(n)]


def _episode(body: dict[str, object]) -> str:
    params = body[RESPONSES_CREATE_PARAMS]
    assert isinstance(params, dict)
    return str(json.loads(params[METADATA][EXTRA_BODY])[EPISODE_ID])


def test_an_episode_given_up_on_is_aborted_at_the_sampler() -> None:
    """Of three rows (one stalls past its deadline, one fails with a 422, one answers),
    each rollout's ``/run`` carries an episode id of its own; the stalled and the failed
    are aborted at the sampler once each, the answered one is not, and ``close`` waits
    for the aborts to be sent."""
    aborts: list[str] = []
    lock = threading.Lock()

    async def abort(request: web.Request) -> web.Response:
        with lock:
            aborts.append(request.query["episode_id"])
        return web.json_response({"status": "ok"})

    plan = {"t0": always(Fault.STALL), "t1": always(Fault.HTTP_422)}
    with (
        serve_routes([web.post("/abort_episode", abort)]) as sampler,
        fault_agent(plan, stall_s=5.0) as agent,
        AgentClient(
            {"a": agent.url},
            retry=RetryPolicy(max_attempts=1),
            timeouts=Timeouts(request=0.5),
            sampler_url=f"{sampler}/v1",
        ) as client,
    ):
        stalled, failed, answered = client.run_sync(_rows(3), eos_token_id=EOS)
    assert (stalled.status, failed.status) == (RolloutStatus.TIMEOUT, RolloutStatus.AGENT_ERROR)
    assert answered.status is RolloutStatus.OK, answered.error
    episodes = {r.body[TASK_KEY]: _episode(r.body) for r in agent.records()}
    assert len(set(episodes.values())) == 3
    assert all(e.startswith("faults.jsonl:") for e in episodes.values())
    assert sorted(aborts) == sorted([episodes["t0"], episodes["t1"]])


def test_a_cancelled_play_is_aborted_too() -> None:
    """A rollout cancelled while it plays (a straggler cut, a stream closed) is aborted."""
    aborts: list[str] = []

    async def abort(request: web.Request) -> web.Response:
        aborts.append(request.query["episode_id"])
        return web.json_response({"status": "ok"})

    async def play(agent_url: str, sampler: str) -> None:
        from nemogym_sdk import RolloutRequest

        async with AgentClient({"a": agent_url}, sampler_url=sampler) as client:
            request = RolloutRequest(row=_rows(1)[0], repeat_index=0)
            task = asyncio.create_task(client.play(request, eos_token_id=EOS))
            await asyncio.sleep(0.3)
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    with (
        serve_routes([web.post("/abort_episode", abort)]) as sampler,
        fault_agent({"t0": always(Fault.STALL)}, stall_s=5.0) as agent,
    ):
        asyncio.run(play(agent.url, sampler))
        (record,) = agent.records()
    assert aborts == [_episode(record.body)]
