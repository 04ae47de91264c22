"""Fault injection: AgentClient and Verifier against servers that fail, stall, reset and lie.

The servers (``tests/fault_agent.py``) are real loopback HTTP servers that fail by a
deterministic plan keyed by the row's ``task_id`` and the attempt number, and record every
attempt. Each test checks both sides: what the client returned, and what the server saw.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import threading
import time
from collections import Counter
from collections.abc import AsyncGenerator, Iterator

import attrs
import numpy as np
import pytest
from aiohttp import web

from nemogym_sdk import (
    AgentClient,
    RetryPolicy,
    Rollout,
    RolloutStatus,
    TaskRow,
    Timeouts,
    Verifier,
    VerifyItem,
    clear_verifier_cache,
    reward_nemo_gym_verify,
    verify_stats,
)
from nemogym_sdk.testing.fake_agent import serve_routes
from tests.axolotl.fakes import head_server
from tests.fault_agent import (
    HTTP_STATUS,
    REPEAT_IS_FINAL,
    RETRYABLE,
    TASK_KEY,
    Fault,
    FaultAgent,
    FaultScript,
    InFlight,
    always,
    burst,
    expected_reward,
    expected_rollout,
    fault_agent,
    fault_resources_server,
    fault_row,
)

EOS = 2
FAST_RETRY = RetryPolicy(max_attempts=4, base_delay=0.001, max_delay=0.01)

TRANSIENT: tuple[FaultScript, ...] = (
    burst(Fault.HTTP_500, 1),
    FaultScript(faults=(Fault.HTTP_500, Fault.HTTP_503)),
    burst(Fault.HTTP_503, 3),
    burst(Fault.HTTP_429, 2),
    burst(Fault.RESET, 1),
    burst(Fault.RESET_MID_BODY, 2),
    burst(Fault.TRUNCATED, 1),
    burst(Fault.GARBAGE, 1),
    FaultScript(faults=(Fault.HTTP_503, Fault.RESET, Fault.TRUNCATED)),
)
"""Scripts that fail at most ``max_attempts - 1`` times in all: always retried to success."""

PERMANENT: tuple[FaultScript, ...] = (
    always(Fault.HTTP_500),
    always(Fault.HTTP_503),
    always(Fault.HTTP_429),
    always(Fault.HTTP_422),
    always(Fault.RESET),
    always(Fault.RESET_MID_BODY),
    always(Fault.TRUNCATED),
    always(Fault.NON_JSON),
)


def _rows(n: int, agent: str | None = None, start: int = 0) -> list[TaskRow]:
    """Rows ``t<start>`` .. with row ids ``faults.jsonl:<i>``."""
    return [
        TaskRow(row_id=f"faults.jsonl:{i}", data=fault_row(i, agent))
        for i in range(start, start + n)
    ]


def _task(rollout: Rollout) -> str:
    """The task id of the row a rollout is tagged with."""
    assert rollout.row_id is not None
    return "t" + rollout.row_id.rsplit(":", 1)[1]


def _mixed_plan(n: int, rng: random.Random) -> dict[str, FaultScript]:
    """About 20 % faulty rows (two thirds transient), 0.5 % stalls, 5 % slow-but-OK rows."""
    plan: dict[str, FaultScript] = {}
    for i in range(n):
        draw = rng.random()
        if draw < 0.13:
            plan[f"t{i}"] = rng.choice(TRANSIENT)
        elif draw < 0.195:
            plan[f"t{i}"] = rng.choice(PERMANENT)
        elif draw < 0.20:
            plan[f"t{i}"] = always(Fault.STALL)
        elif draw < 0.25:
            plan[f"t{i}"] = always(Fault.SLOW)
    return plan


def _expect(script: FaultScript, generations: int, retry: RetryPolicy) -> tuple[RolloutStatus, int]:
    """The status a row's rollouts must end with, and the attempts the server must see.

    A transient script's ``k`` failures are shared by the row's repeats, each of which
    then succeeds once: ``k + generations`` attempts. A permanent retryable fault costs
    every repeat ``max_attempts``, a 500 that repeats exactly two (the repeat is final); a
    fault that is not retried costs one attempt each.
    """
    if not script.permanent:
        assert all(f in RETRYABLE for f in script.faults)
        assert len(script.faults) < retry.max_attempts
        return RolloutStatus.OK, len(script.faults) + generations
    assert not script.faults
    fault = script.then
    per_rollout = retry.max_attempts if fault in RETRYABLE else 1
    if fault in REPEAT_IS_FINAL:
        per_rollout = min(2, retry.max_attempts)
    if fault in HTTP_STATUS:
        status = RolloutStatus.AGENT_ERROR
    elif fault is Fault.STALL:
        status = RolloutStatus.TIMEOUT
    elif fault is Fault.NON_JSON:
        status = RolloutStatus.INVALID
    else:
        status = RolloutStatus.TRANSPORT_ERROR
    return status, per_rollout * generations


def _assert_matches_row(rollout: Rollout) -> None:
    """An OK rollout carries exactly the tokens the agent generated for its own row."""
    expected = expected_rollout(_task(rollout))
    assert rollout.status is RolloutStatus.OK, rollout.error
    assert tuple(rollout.prompt_ids.tolist()) == expected.prompt_ids
    assert tuple(rollout.completion_ids.tolist()) == expected.completion_ids
    assert tuple(rollout.env_mask.tolist()) == expected.env_mask
    assert tuple(rollout.logprobs.tolist()) == pytest.approx(expected.logprobs)
    assert rollout.reward == pytest.approx(expected.reward)
    assert rollout.num_turns == expected.num_turns


def _assert_failure_shape(rollout: Rollout) -> None:
    """A failed rollout keeps the seed contract's one-token shape and says why."""
    assert rollout.prompt_ids.tolist() == [EOS]
    assert rollout.completion_ids.tolist() == [EOS]
    assert rollout.env_mask.tolist() == [0]
    assert rollout.error


# --- nothing is lost -----------------------------------------------------------------------


async def test_two_thousand_rollouts_with_twenty_percent_faults_lose_nothing() -> None:
    """2,000 rollouts, 20 % faulty: all back once, in order, retried or typed as failures."""
    n_rows, generations = 1000, 2
    plan = _mixed_plan(n_rows, random.Random(20_260_512))
    faulty = [s for s in plan.values() if s != always(Fault.SLOW)]
    assert 0.15 <= len(faulty) / n_rows <= 0.25
    rows = _rows(n_rows)
    with fault_agent(plan, retry_after=0.002) as agent:
        async with AgentClient(
            {"a": agent.url},
            retry=FAST_RETRY,
            timeouts=Timeouts(request=5.0),  # generous: client and server share one GIL
            max_concurrency=48,
            seed=0,
        ) as client:
            started = time.monotonic()
            rollouts = await client.run(rows, eos_token_id=EOS, num_generations=generations)
            elapsed = time.monotonic() - started

    assert len(rollouts) == n_rows * generations
    assert [(r.row_id, r.repeat_index) for r in rollouts] == [
        (row.row_id, k) for row in rows for k in range(generations)
    ]
    assert all(r.agent_name == "a" for r in rollouts)
    statuses: Counter[RolloutStatus] = Counter()
    for rollout in rollouts:
        task = _task(rollout)
        script = plan.get(task, FaultScript())
        status, attempts = _expect(script, generations, FAST_RETRY)
        statuses[status] += 1
        assert rollout.status is status, (task, script, rollout.error)
        assert agent.attempts(task) == attempts, (task, script)
        if status is RolloutStatus.OK:
            _assert_matches_row(rollout)
            continue
        _assert_failure_shape(rollout)
        if script.then in HTTP_STATUS:
            assert f"HTTP {HTTP_STATUS[script.then]}" in (rollout.error or "")
    # every kind of fault was really injected, and failures stayed the minority
    injected = agent.fault_counts()
    assert set(Fault) - set(injected) == {Fault.REDIRECT_NON_HTTP}
    assert statuses[RolloutStatus.OK] > 0.85 * len(rollouts)
    assert {s for s in statuses if s is not RolloutStatus.OK} == {
        RolloutStatus.AGENT_ERROR,
        RolloutStatus.TRANSPORT_ERROR,
        RolloutStatus.TIMEOUT,
        RolloutStatus.INVALID,
    }
    # no row got more attempts than its rollouts may make
    per_key = Counter(r.key for r in agent.records())
    assert max(per_key.values()) <= generations * FAST_RETRY.max_attempts
    assert elapsed < 45, f"2,000 rollouts took {elapsed:.1f} s"


def test_raw_runs_tag_the_body_they_got_and_count_attempts() -> None:
    """Each RawRun's body is its own row's; its attempt count is what the server saw."""
    plan = {k: s for k, s in _mixed_plan(300, random.Random(7)).items() if s != always(Fault.STALL)}
    with (
        fault_agent(plan) as agent,
        AgentClient({"a": agent.url}, retry=FAST_RETRY, max_concurrency=32) as client,
    ):
        raws = client.run_raw_sync(_rows(300))
    assert [raw.index for raw in raws] == list(range(300))
    for raw in raws:
        task = raw.request.row.data[TASK_KEY]
        status, attempts = _expect(plan.get(task, FaultScript()), 1, FAST_RETRY)
        assert 1 <= raw.attempts <= FAST_RETRY.max_attempts
        assert raw.attempts == attempts == agent.attempts(task)
        if status is RolloutStatus.INVALID:  # a 200 that is not JSON: the parser's call
            assert raw.status is RolloutStatus.OK and raw.body is not None
        else:
            assert raw.status is status, (task, raw.error)
        if status is RolloutStatus.OK:
            assert raw.http_status == 200
            assert raw.json()[TASK_KEY] == task
        else:
            assert raw.error or raw.body


# --- what is retried, and how ---------------------------------------------------------------


def test_client_errors_are_never_retried() -> None:
    """4xx other than 429 is a typed AGENT_ERROR after exactly one attempt."""
    plan = {"t0": always(Fault.HTTP_422), "t1": burst(Fault.HTTP_422, 1)}
    with (
        fault_agent(plan) as agent,
        AgentClient({"a": agent.url}, retry=FAST_RETRY) as client,
    ):
        first, second = client.run_raw_sync(_rows(2))
        (rollout,) = client.run_sync(_rows(1), eos_token_id=EOS)
    assert (first.http_status, first.attempts) == (second.http_status, second.attempts) == (422, 1)
    assert rollout.status is RolloutStatus.AGENT_ERROR
    assert "HTTP 422" in (rollout.error or "") and "injected 422" in (rollout.error or "")
    assert agent.attempts("t0") == 2 and agent.attempts("t1") == 1


def test_a_500_that_repeats_exactly_is_final_after_two_attempts() -> None:
    """The same 500 twice is the episode's failure: two attempts, not four, and the reason
    says so; a repeated 503 ("try later") still gets every attempt; with
    ``retry_repeated_errors`` the 500s are retried through to the success behind them."""
    plan = {"t0": always(Fault.HTTP_500), "t1": always(Fault.HTTP_503)}
    plan |= {"t2": FaultScript(faults=(Fault.HTTP_500,) * 3)}
    with (
        fault_agent(plan) as agent,
        AgentClient({"a": agent.url}, retry=FAST_RETRY) as client,
    ):
        final, later, _ = client.run_sync(_rows(3), eos_token_id=EOS)
    assert final.status is later.status is RolloutStatus.AGENT_ERROR
    assert "HTTP 500" in (final.error or "") and "after 2 attempts" in (final.error or "")
    assert (agent.attempts("t0"), agent.attempts("t1")) == (2, FAST_RETRY.max_attempts)
    assert agent.attempts("t2") == 2
    replaying = attrs.evolve(FAST_RETRY, retry_repeated_errors=True)
    with (
        fault_agent(plan) as agent,
        AgentClient({"a": agent.url}, retry=replaying) as client,
    ):
        final, _, recovered = client.run_sync(_rows(3), eos_token_id=EOS)
    assert recovered.status is RolloutStatus.OK, recovered.error
    assert (agent.attempts("t0"), agent.attempts("t2")) == (FAST_RETRY.max_attempts, 4)


def test_a_server_error_cut_short_by_the_deadline_keeps_its_cause() -> None:
    """A 500 that takes 0.4 s and differs each time is retried until the 1 s deadline cuts
    an attempt: the rollout is a TIMEOUT, and its reason still names the 500 before it."""
    answers = iter(range(100))

    async def run(request: web.Request) -> web.Response:
        await asyncio.sleep(0.4)
        return web.json_response({"detail": f"boom {next(answers)}"}, status=500)

    retry = RetryPolicy(max_attempts=10, base_delay=0.001, max_delay=0.01)
    with (
        serve_routes([web.post("/run", run)]) as url,
        AgentClient({"a": url}, retry=retry, timeouts=Timeouts(total=1.0)) as client,
    ):
        (rollout,) = client.run_sync(_rows(1), eos_token_id=EOS)
    assert rollout.status is RolloutStatus.TIMEOUT
    assert "the attempt before: HTTP 500" in (rollout.error or ""), rollout.error
    assert "boom 1" in (rollout.error or "")


def test_retry_after_is_honoured() -> None:
    """A 429's Retry-After (0.3 s) sets the floor of the backoff; a 503 without it does not."""
    retry = RetryPolicy(max_attempts=3, base_delay=0.001, max_delay=2.0)
    plan = {"t0": burst(Fault.HTTP_429, 2), "t1": burst(Fault.HTTP_503, 2)}
    with (
        fault_agent(plan, retry_after=0.3) as agent,
        AgentClient({"a": agent.url}, retry=retry) as client,
    ):
        rollouts = client.run_sync(_rows(2), eos_token_id=EOS)
    assert all(r.status is RolloutStatus.OK for r in rollouts)
    throttled = [r.at for r in agent.records("t0")]
    plain = [r.at for r in agent.records("t1")]
    assert len(throttled) == len(plain) == 3
    for gap in np.diff(throttled):
        assert 0.28 <= gap < 1.3, gap
    assert max(np.diff(plain)) < 0.25


def test_retry_after_is_capped_by_max_delay() -> None:
    """A server asking for an hour's pause gets at most ``max_delay`` per retry."""
    retry = RetryPolicy(max_attempts=2, base_delay=0.001, max_delay=0.05)
    with (
        fault_agent({"t0": burst(Fault.HTTP_429, 1)}, retry_after=3600) as agent,
        AgentClient({"a": agent.url}, retry=retry) as client,
    ):
        started = time.monotonic()
        (rollout,) = client.run_sync(_rows(1), eos_token_id=EOS)
    assert rollout.status is RolloutStatus.OK
    assert time.monotonic() - started < 2.0
    assert agent.attempts("t0") == 2


def test_stall_is_a_timeout_bounded_by_the_request_budget() -> None:
    """A request that never gets an answer ends as TIMEOUT after about ``Timeouts.request``."""
    with (
        fault_agent({"t0": always(Fault.STALL)}) as agent,
        AgentClient({"a": agent.url}, retry=FAST_RETRY, timeouts=Timeouts(request=0.4)) as client,
    ):
        started = time.monotonic()
        stalled, fine = client.run_sync(_rows(2), eos_token_id=EOS)
        elapsed = time.monotonic() - started
    assert stalled.status is RolloutStatus.TIMEOUT and fine.status is RolloutStatus.OK
    _assert_failure_shape(stalled)
    assert 0.35 <= elapsed < 2.0
    assert agent.attempts("t0") == 1


def test_batch_deadline_returns_everything_pending_as_timeout() -> None:
    """``Timeouts.total`` ends the batch on time: finished rows OK, the rest TIMEOUT."""
    fine = 8
    plan = {f"t{i}": always(Fault.STALL) for i in range(fine, 60)}
    with (
        fault_agent(plan) as agent,
        AgentClient(
            {"a": agent.url},
            retry=FAST_RETRY,
            timeouts=Timeouts(request=30.0, total=0.6),
            max_concurrency=8,
        ) as client,
    ):
        started = time.monotonic()
        rollouts = client.run_sync(_rows(60), eos_token_id=EOS)
        elapsed = time.monotonic() - started
    assert 0.55 <= elapsed < 2.0, elapsed
    assert [r.row_id for r in rollouts] == [f"faults.jsonl:{i}" for i in range(60)]
    assert all(r.status is RolloutStatus.OK for r in rollouts[:fine])
    assert all(r.status is RolloutStatus.TIMEOUT for r in rollouts[fine:])
    # at most 8 stalls were ever sent; the rest were never sent at all
    assert len(agent.records()) <= fine + 8


def test_backoff_never_sleeps_past_the_batch_deadline() -> None:
    """A 1 s Retry-After and a 0.3 s batch deadline: the 429 comes back now, not in 1 s."""
    retry = RetryPolicy(max_attempts=5, base_delay=1.0, max_delay=1.0)
    with (
        fault_agent(
            {"t0": always(Fault.HTTP_429), "t1": always(Fault.HTTP_503)}, retry_after=1.0
        ) as agent,
        AgentClient({"a": agent.url}, retry=retry, timeouts=Timeouts(total=0.3)) as client,
    ):
        started = time.monotonic()
        throttled, failing = client.run_sync(_rows(2), eos_token_id=EOS)
        elapsed = time.monotonic() - started
    assert throttled.status is failing.status is RolloutStatus.AGENT_ERROR
    assert "HTTP 429" in (throttled.error or "") and "HTTP 503" in (failing.error or "")
    assert elapsed < 1.0
    assert agent.attempts("t0") == 1  # waiting 1 s would pass the deadline: no retry
    assert agent.attempts("t1") <= 3  # 503 backoffs are drawn in [0, 1] s: some fit


# --- concurrency -----------------------------------------------------------------------------


async def test_global_and_per_host_limits_are_respected_and_used() -> None:
    """Slow rows: at most 6 in flight per host and 10 overall, and both limits are reached."""
    shared = InFlight()
    slow = {f"t{i}": always(Fault.SLOW) for i in range(60)}
    with (
        fault_agent(slow, slow_s=0.1, shared=shared) as a,
        fault_agent(slow, slow_s=0.1, shared=shared) as b,
    ):
        async with AgentClient(
            {"a": a.url, "b": b.url}, max_concurrency=10, max_per_host=6
        ) as client:
            # one host: the per-host limit binds
            only_a = await client.run(_rows(24, "a"), eos_token_id=EOS)
            assert a.in_flight.peak == 6 and b.in_flight.peak == 0
            # two hosts, rows alternating: the global limit binds
            rows = [TaskRow(row_id=str(i), data=fault_row(i, "ab"[i % 2])) for i in range(60)]
            rollouts = await client.run(rows, eos_token_id=EOS)
    assert all(r.status is RolloutStatus.OK for r in [*only_a, *rollouts])
    assert a.in_flight.peak <= 6 and b.in_flight.peak <= 6
    assert shared.peak == 10


async def test_one_hot_agent_does_not_starve_another() -> None:
    """Rows sorted by agent: agent b starts while a is still at its per-host cap.

    With ``max_concurrency=10`` and ``max_per_host=6``, rows ``a a ... a b b ... b`` should
    run 6 on a and 4 on b at once. Jobs that hold a global slot while they wait for a's
    per-host slot leave b idle until a's queue drains.
    """
    shared = InFlight()
    slow = {f"t{i}": always(Fault.SLOW) for i in range(60)}
    with (
        fault_agent(slow, slow_s=0.1, shared=shared) as a,
        fault_agent(slow, slow_s=0.1, shared=shared) as b,
    ):
        rows = [
            TaskRow(row_id=str(i), data=fault_row(i, "a" if i < 30 else "b")) for i in range(60)
        ]
        async with AgentClient(
            {"a": a.url, "b": b.url}, max_concurrency=10, max_per_host=6
        ) as client:
            await client.run(rows, eos_token_id=EOS)
    first_b = b.records()[0].at
    seventh_a = a.records()[6].at  # sent only once one of a's first six has finished
    assert first_b < seventh_a, "agent b sat idle while a's rows held the global slots"


# --- streaming -------------------------------------------------------------------------------


async def test_stream_yields_every_rollout_exactly_once_as_they_complete() -> None:
    """``stream`` under faults yields each (row, repeat) once, in completion order.

    The first row answers after a second; the other 78 rollouts need milliseconds each, so
    a stream that keeps the input order would yield the slow row first. How many come
    before it depends on the machine's load (a retried row can finish late on a busy
    box), so the bound is half of them, not all.
    """
    plan = {"t0": always(Fault.SLOW), "t1": burst(Fault.RESET, 2), "t2": always(Fault.HTTP_500)}
    plan |= {f"t{i}": burst(Fault.HTTP_503, 1) for i in range(3, 40, 3)}
    with fault_agent(plan, slow_s=1.0) as agent:
        async with AgentClient({"a": agent.url}, retry=FAST_RETRY) as client:
            seen = [r async for r in client.stream(_rows(40), eos_token_id=EOS, num_generations=2)]
    keys = [(r.row_id, r.repeat_index) for r in seen]
    assert len(keys) == len(set(keys)) == 80
    assert set(keys) == {(f"faults.jsonl:{i}", k) for i in range(40) for k in range(2)}
    first_slow = next(i for i, r in enumerate(seen) if r.row_id == "faults.jsonl:0")
    assert first_slow >= 39, f"only {first_slow} rollouts came before the slow row"
    for rollout in seen:
        if _task(rollout) == "t2":
            assert rollout.status is RolloutStatus.AGENT_ERROR
        else:
            _assert_matches_row(rollout)


def _other_tasks() -> list[asyncio.Task[object]]:
    current = asyncio.current_task()
    return [t for t in asyncio.all_tasks() if t is not current and not t.done()]


async def _settle(seconds: float = 1.0) -> list[asyncio.Task[object]]:
    """Wait (up to ``seconds``) for every other task to finish; return those still running."""
    stop = time.monotonic() + seconds
    while _other_tasks() and time.monotonic() < stop:
        await asyncio.sleep(0.01)
    return _other_tasks()


async def _assert_quiet(agent: FaultAgent, most: int) -> None:
    """No task of ours is left, and the agent gets no new request after that."""
    assert await _settle() == []
    await asyncio.sleep(0.1)  # requests already on the wire when cancelled may still land
    sent = len(agent.records())
    await asyncio.sleep(0.2)
    assert len(agent.records()) == sent <= most


async def test_breaking_out_of_stream_leaves_no_task_running() -> None:
    """A consumer that stops early cancels the rest: no task left, no request sent after."""
    slow = {f"t{i}": always(Fault.SLOW) for i in range(300)}
    with fault_agent(slow, slow_s=0.05) as agent:
        async with AgentClient({"a": agent.url}, max_concurrency=8) as client:
            # a plain break: the loop finalizes the abandoned generator
            async for _ in client.stream(_rows(100), eos_token_id=EOS):
                break
            await _assert_quiet(agent, most=40)
            # an explicit aclose
            stream = client.stream(_rows(100, start=100), eos_token_id=EOS)
            async with contextlib.aclosing(stream):
                async for _ in stream:
                    break
            await _assert_quiet(agent, most=80)
            # the client is still usable afterwards
            (again,) = await client.run(_rows(1, start=200), eos_token_id=EOS)
    assert again.status is RolloutStatus.OK


# --- cookies, sync facade -------------------------------------------------------------------


def test_no_cookie_is_ever_sent_on_run() -> None:
    """Every /run answer sets a session cookie; no /run request ever carries one back."""
    plan = {f"t{i}": burst(Fault.HTTP_503, 1) for i in range(0, 50, 5)}
    with (
        fault_agent(plan) as agent,
        AgentClient({"a": agent.url}, retry=FAST_RETRY, max_concurrency=4) as client,
    ):
        for _ in range(2):
            rollouts = client.run_sync(_rows(50), eos_token_id=EOS, num_generations=2)
            assert all(r.status is RolloutStatus.OK for r in rollouts)
    records = agent.records()
    assert len(records) == 200 + len(plan)  # a burst fails only its first attempt, ever
    assert [r.cookie_header for r in records] == [None] * len(records)


def test_run_sync_reuses_one_loop_thread_and_one_session() -> None:
    """20 ``run_sync`` calls: one loop thread, a flat thread count, pooled connections."""
    with (
        fault_agent({"t3": burst(Fault.RESET, 1)}) as agent,
        AgentClient({"a": agent.url}, retry=FAST_RETRY, max_concurrency=4) as client,
    ):
        client.run_sync(_rows(8), eos_token_id=EOS)
        threads = threading.active_count()
        for call in range(20):
            rollouts = client.run_sync(_rows(8, start=10 * call), eos_token_id=EOS)
            assert [_task(r) for r in rollouts] == [f"t{10 * call + i}" for i in range(8)]
            for rollout in rollouts:
                _assert_matches_row(rollout)
            assert threading.active_count() == threads
        loops = [t for t in threading.enumerate() if t.name == AgentClient._thread_name]
        assert len(loops) == 1
    ports = {r.peer_port for r in agent.records()}
    assert len(ports) <= 4 + 1  # the pool, plus the connection the reset killed
    assert not any(t.name == AgentClient._thread_name for t in threading.enumerate())


# --- verifier --------------------------------------------------------------------------------


def _items(n: int) -> list[VerifyItem]:
    """``n`` completions for rows ``t0`` .. on the resources server ``rs``."""
    return [
        VerifyItem(resources_server="rs", row=fault_row(i), completion=f"answer {i}")
        for i in range(n)
    ]


def test_verifier_retries_bursts_and_types_permanent_failures() -> None:
    """503 bursts on either call are retried; permanent failures come back typed."""
    seed_plan = {"t1": burst(Fault.HTTP_503, 2), "t2": always(Fault.HTTP_503)}
    verify_plan = {
        "t3": burst(Fault.HTTP_503, 3),
        "t4": always(Fault.HTTP_500),
        "t5": always(Fault.NON_JSON),
        "t6": burst(Fault.RESET, 1),
        "t7": always(Fault.HTTP_422),
        "t8": always(Fault.RESET),
    }
    with (
        fault_resources_server(seed_plan, verify_plan) as server,
        Verifier({"rs": server.url}, retry=FAST_RETRY, max_concurrency=16) as verifier,
    ):
        results = verifier.verify_sync(_items(40))
    assert len(results) == 40
    expected_status = {
        "t2": RolloutStatus.AGENT_ERROR,
        "t4": RolloutStatus.AGENT_ERROR,
        "t5": RolloutStatus.INVALID,
        "t7": RolloutStatus.AGENT_ERROR,
        "t8": RolloutStatus.TRANSPORT_ERROR,
    }
    for i, result in enumerate(results):
        status = expected_status.get(f"t{i}", RolloutStatus.OK)
        assert result.status is status, (i, result.error)
        if status is RolloutStatus.OK:
            assert result.reward == pytest.approx(expected_reward(f"t{i}"))
        else:
            assert result.reward is None and result.error
    assert "HTTP 503" in (results[2].error or "") and "HTTP 500" in (results[4].error or "")
    assert server.attempts("t1", "/seed_session") == 3
    assert server.attempts("t2", "/seed_session") == FAST_RETRY.max_attempts
    assert server.attempts("t2", "/verify") == 0  # never verified without a session
    assert server.attempts("t3", "/verify") == 4
    assert server.attempts("t4", "/verify") == 2  # the same 500 twice is final
    assert server.attempts("t7", "/verify") == 1


def test_verifier_cookies_stay_with_their_item() -> None:
    """Each /verify carries exactly the cookie its own /seed_session set, retries included."""
    seed_plan = {f"t{i}": burst(Fault.HTTP_503, 1 + i % 2) for i in range(0, 200, 7)}
    verify_plan = {f"t{i}": burst(Fault.RESET, 1) for i in range(3, 200, 11)}
    with (
        fault_resources_server(seed_plan, verify_plan) as server,
        Verifier({"rs": server.url}, retry=FAST_RETRY, max_concurrency=64) as verifier,
    ):
        results = verifier.verify_sync(_items(200))
    assert all(r.status is RolloutStatus.OK for r in results)
    for seed in server.records(path="/seed_session"):
        assert seed.cookie_header is None
    for i, result in enumerate(results):
        seeded = server.attempts(f"t{i}", "/seed_session")
        cookie = f"t{i}-{seeded}"  # set by the seed that succeeded, the last one
        verifies = server.records(f"t{i}", "/verify")
        assert verifies and all(dict(v.cookies) == {"session": cookie} for v in verifies)
        assert result.response is not None and result.response["session"] == cookie


# --- regressions of bugs this suite found ---------------------------------------------------


def test_unlisted_aiohttp_error_is_one_typed_failure_not_a_lost_batch() -> None:
    """A redirect to a non-HTTP URL fails that rollout only; the other rows come back OK."""
    with (
        fault_agent({"t1": always(Fault.REDIRECT_NON_HTTP)}) as agent,
        AgentClient({"a": agent.url}, retry=FAST_RETRY) as client,
    ):
        rollouts = client.run_sync(_rows(3), eos_token_id=EOS)
    assert [r.status for r in rollouts] == [
        RolloutStatus.OK,
        RolloutStatus.TRANSPORT_ERROR,
        RolloutStatus.OK,
    ]


async def test_closing_stream_cancels_its_requests_before_aclose_returns() -> None:
    """``aclose()`` on ``stream()`` returns only once no request of it is left running."""
    slow = {f"t{i}": always(Fault.SLOW) for i in range(100)}
    with fault_agent(slow, slow_s=0.05) as agent:
        async with AgentClient({"a": agent.url}, max_concurrency=8) as client:
            stream = client.stream(_rows(100), eos_token_id=EOS)
            assert isinstance(stream, AsyncGenerator)
            async with contextlib.aclosing(stream):
                async for _ in stream:
                    break
            left = _other_tasks()
            await _settle()
    assert left == []


def test_fault_script_applies_faults_in_attempt_order() -> None:
    """The harness itself: a script's faults apply in attempt order, then its steady state."""
    script = FaultScript(faults=(Fault.HTTP_503, Fault.RESET), then=Fault.HTTP_422)
    assert [script.fault(n) for n in range(1, 5)] == [
        Fault.HTTP_503,
        Fault.RESET,
        Fault.HTTP_422,
        Fault.HTTP_422,
    ]
    assert script.permanent and not burst(Fault.HTTP_500, 3).permanent
    with fault_agent({"t0": script}) as agent:
        assert isinstance(agent, FaultAgent) and agent.url.startswith("http://127.0.0.1:")


# --- opt-in retries of stalled attempts -------------------------------------------------------


def test_a_stall_is_final_by_default() -> None:
    """Without ``retry_timeouts`` a stalled /run is one attempt and a TIMEOUT, even when
    the next attempt would have succeeded."""
    with (
        fault_agent({"t0": burst(Fault.STALL, 1)}, stall_s=5.0) as agent,
        AgentClient({"a": agent.url}, retry=FAST_RETRY, timeouts=Timeouts(request=0.4)) as client,
    ):
        (rollout,) = client.run_sync(_rows(1), eos_token_id=EOS)
    assert rollout.status is RolloutStatus.TIMEOUT
    assert agent.attempts("t0") == 1


def test_retry_timeouts_retries_a_stalled_run_to_success() -> None:
    """With ``RetryPolicy(retry_timeouts=True)`` a stalled attempt is retried and the row's
    rollout comes back OK from the second attempt."""
    retry = RetryPolicy(max_attempts=3, base_delay=0.001, max_delay=0.01, retry_timeouts=True)
    with (
        fault_agent({"t0": burst(Fault.STALL, 1)}, stall_s=5.0) as agent,
        AgentClient({"a": agent.url}, retry=retry, timeouts=Timeouts(request=0.4)) as client,
    ):
        (raw,) = client.run_raw_sync(_rows(1))
    assert raw.status is RolloutStatus.OK and raw.attempts == 2
    assert agent.attempts("t0") == 2
    _assert_matches_row(raw.rollout(EOS))


def test_retried_stalls_still_end_as_timeout_after_max_attempts() -> None:
    """A server that always stalls gets exactly ``max_attempts`` attempts, then TIMEOUT."""
    retry = RetryPolicy(max_attempts=2, base_delay=0.001, max_delay=0.01, retry_timeouts=True)
    with (
        fault_agent({"t0": always(Fault.STALL)}, stall_s=5.0) as agent,
        AgentClient({"a": agent.url}, retry=retry, timeouts=Timeouts(request=0.3)) as client,
    ):
        (raw,) = client.run_raw_sync(_rows(1))
    assert raw.status is RolloutStatus.TIMEOUT and raw.attempts == 2
    assert agent.attempts("t0") == 2


def test_verifier_sends_through_the_same_retry_path() -> None:
    """The verifier's /verify honours the same policy: a stall is retried when opted in."""
    retry = RetryPolicy(max_attempts=3, base_delay=0.001, max_delay=0.01, retry_timeouts=True)
    with (
        fault_resources_server(verify_plan={"t0": burst(Fault.STALL, 1)}) as server,
        Verifier({"rs": server.url}, retry=retry, timeouts=Timeouts(request=0.4)) as verifier,
    ):
        (result,) = verifier.verify_sync(_items(1))
    assert result.status is RolloutStatus.OK
    assert result.reward == pytest.approx(expected_reward("t0"))
    assert server.attempts("t0", "/verify") == 2


# --- reward_nemo_gym_verify: one verifier per deployment, unscored samples counted ----------


@pytest.fixture
def fresh_reward_cache() -> Iterator[None]:
    """A clean verifier cache and counters, closed again afterwards."""
    clear_verifier_cache()
    verify_stats.reset()
    yield
    clear_verifier_cache()
    verify_stats.reset()


def _trl_columns(rows: list[dict[str, object]], server: str = "rs") -> dict[str, object]:
    return {
        "resources_server_ref": [{"name": server}] * len(rows),
        "verify_extra": rows,
    }


@pytest.mark.usefixtures("fresh_reward_cache")
def test_reward_nemo_gym_verify_discovers_once_and_reuses_its_verifier() -> None:
    """Two calls against one head server ask it for the deployment once, not per call."""
    with (
        fault_resources_server() as server,
        head_server({}, {"rs": server.url}) as head,
    ):
        rows = [fault_row(i) for i in range(3)]
        first = reward_nemo_gym_verify(["a"] * 3, head=head.url, **_trl_columns(rows))
        second = reward_nemo_gym_verify(["b"] * 3, head=head.url, **_trl_columns(rows))
        assert head.calls("/server_instances") == 1
        assert head.calls("/global_config_dict_yaml") == 1
    expected = [pytest.approx(expected_reward(f"t{i}")) for i in range(3)]
    assert first == expected and second == expected
    assert verify_stats.scored == 6 and verify_stats.unscored == 0


@pytest.mark.usefixtures("fresh_reward_cache")
def test_reward_nemo_gym_verify_logs_and_counts_what_it_cannot_score(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A failed /verify and an unknown server score 0.0, and each is counted by status
    and reported in one warning; a real score is not counted as unscored."""
    rows = [fault_row(i) for i in range(3)]
    refs = [{"name": "rs"}, {"name": "rs"}, {"name": "nowhere"}]
    with (
        fault_resources_server(verify_plan={"t1": always(Fault.HTTP_422)}) as server,
        caplog.at_level(logging.WARNING, logger="nemogym_sdk.verify"),
    ):
        rewards = reward_nemo_gym_verify(
            ["x"] * 3, servers={"rs": server.url}, resources_server_ref=refs, verify_extra=rows
        )
    assert rewards == [pytest.approx(expected_reward("t0")), 0.0, 0.0]
    assert verify_stats.scored == 1 and verify_stats.unscored == 2
    assert verify_stats.unscored_by_status == {"agent_error": 1, "invalid": 1}
    (record,) = [r for r in caplog.records if r.name == "nemogym_sdk.verify"]
    assert record.levelno == logging.WARNING
    assert "2 of 3" in record.getMessage() and "nowhere" in record.getMessage()


@pytest.mark.usefixtures("fresh_reward_cache")
def test_reward_nemo_gym_verify_counts_an_unreachable_head(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """No head server: every completion scores 0.0, counted as a transport error."""
    with caplog.at_level(logging.WARNING, logger="nemogym_sdk.verify"):
        rewards = reward_nemo_gym_verify(["x", "y"], head="127.0.0.1:9")
    assert rewards == [0.0, 0.0]
    assert verify_stats.unscored_by_status == {"transport_error": 2}
    assert "127.0.0.1:9" in (verify_stats.last_error or "")
    assert any("could not score" in r.getMessage() for r in caplog.records)
