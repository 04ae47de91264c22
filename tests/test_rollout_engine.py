"""``RolloutEngine`` against a real HTTP agent on loopback whose episodes take heavy-tailed
times and sometimes stall (the agent is a stand-in: the engine's layer only)."""

from __future__ import annotations

import asyncio
import collections
import random
import re
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from aiohttp import web

from nemogym_sdk import (
    AgentClient,
    ConfigError,
    EngineOptions,
    EngineStalledError,
    RolloutEngine,
    RolloutStatus,
    TaskRow,
    Timeouts,
    UsageError,
)
from nemogym_sdk.rollout_engine.pacing import keeps_bound
from nemogym_sdk.testing.fake_agent import serve_routes
from nemogym_sdk.wire import policy_version_envelope

EOS = 2
STALL_S = 5.0


class Agent:
    """``POST /run``: sleeps the row's next delay, then answers one model turn tagged with
    the sampler's current version; a delay of ``STALL_S`` is a stall."""

    def __init__(self, delays: dict[str, list[float]], errors: frozenset[str] = frozenset()):
        self.delays = delays
        self.errors = errors
        self.version = 0
        self.lock = threading.Lock()
        self.counts: collections.Counter[str] = collections.Counter()
        self.arrivals: list[tuple[float, str]] = []

    async def run(self, request: web.Request) -> web.Response:
        row = await request.json()
        task = row["task_id"]
        with self.lock:
            n = self.counts[task]
            self.counts[task] += 1
            self.arrivals.append((time.monotonic(), task))
            version = self.version
        await asyncio.sleep(self.delays[task][n % len(self.delays[task])])
        if task in self.errors and n % 2:
            return web.json_response({"error": "the environment broke"})
        item = {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "hi"}],
            "prompt_token_ids": [1, 5],
            "generation_token_ids": [7, 8],
            "generation_log_probs": [-0.5, -0.5],
            "routed_experts": policy_version_envelope(version),
        }
        return web.json_response({"response": {"output": [item]}, "reward": float(n % 2)})


def rows(n: int) -> list[TaskRow]:
    return [
        TaskRow(
            row_id=f"t{i}",
            data={"task_id": f"t{i}", "responses_create_params": {"input": "x"}},
        )
        for i in range(n)
    ]


def heavy_tailed(
    seed: int, n_rows: int, draws: int, stall_every: int = 0
) -> dict[str, list[float]]:
    """Pareto(1.2)-distributed episode times (0.01 s and up, capped at 0.6 s), and with
    ``stall_every`` a stall every that many episodes."""
    rng = random.Random(seed)
    out: dict[str, list[float]] = {}
    count = 0
    for i in range(n_rows):
        times = []
        for _ in range(draws):
            count += 1
            if stall_every and count % stall_every == 0:
                times.append(STALL_S)
            else:
                times.append(min(0.6, 0.01 * rng.paretovariate(1.2)))
        out[f"t{i}"] = times
    return out


@pytest.fixture
def serve() -> Iterator[Any]:
    servers: list[Any] = []

    def start(agent: Agent) -> AgentClient:
        context = serve_routes([web.post("/run", agent.run)])
        url = context.__enter__()
        servers.append(context)
        return AgentClient({"agent": url}, timeouts=Timeouts(request=60.0))

    yield start
    for context in servers:
        context.__exit__(None, None, None)


def test_staleness_zero_is_the_synchronous_schedule(serve: Any) -> None:
    """K = 0: step k holds groups 2k and 2k+1, and no group of step k+1 starts before the
    version after step k is published."""
    agent = Agent(heavy_tailed(0, 3, 50))
    client = serve(agent)
    with (
        client,
        RolloutEngine(
            client, rows(3), EngineOptions(num_generations=2, groups_per_step=2), eos_token_id=EOS
        ) as engine,
    ):
        for step in range(4):
            played = engine.next_step()
            assert sorted(g.index for g in played.groups) == [2 * step, 2 * step + 1]
            assert [g.row.row_id for g in sorted(played.groups, key=lambda g: g.index)] == [
                f"t{(2 * step) % 3}",
                f"t{(2 * step + 1) % 3}",
            ]
            assert played.in_flight == 0  # nothing plays ahead of the learner
            published = time.monotonic()
            agent.version = step + 1
            engine.publish(step + 1)
            if step < 3:
                time.sleep(0.05)
                before = [t for t, _ in agent.arrivals if t < published]
                assert len(before) == 4 * (step + 1)  # 2 groups x 2 per step, none early
    for rollout in played.rollouts():
        assert rollout.turn_versions == (3,)


def test_heavy_tails_and_stalls_keep_staleness_bounded_and_lose_nothing(serve: Any) -> None:
    """K = 1, 3 groups of 4 per step, heavy-tailed episodes and a stall every 17th: every
    step gets its groups, none trained more than K versions late, every stall ends as a
    TIMEOUT at its deadline, and every group started comes out exactly once."""
    agent = Agent(heavy_tailed(1, 5, 40, stall_every=17))
    client = serve(agent)
    handed: list[int] = []
    ahead: list[int] = []
    statuses: collections.Counter[str] = collections.Counter()
    with client:
        engine = RolloutEngine(
            client,
            rows(5),
            EngineOptions(
                num_generations=4, groups_per_step=3, max_staleness=1, episode_timeout=0.5
            ),
            eos_token_id=EOS,
        ).start()
        for step in range(8):
            played = engine.next_step(timeout=4 * STALL_S)
            assert len(played.groups) == 3
            ahead.append(played.in_flight)
            assert played.waited_s < STALL_S * 0.8  # a stall never holds the step to its end
            for group in played.groups:
                assert step - group.started_on <= 1
                assert len(group.rollouts) == 4
                assert [r.repeat_index for r in group.rollouts] == [0, 1, 2, 3]
                handed.append(group.index)
                for rollout in group.rollouts:
                    statuses[rollout.status.value] += 1
                    if rollout.status is RolloutStatus.OK:
                        # trained at version `step`: at most K behind the version that played it
                        assert step - rollout.turn_versions[0] <= 1  # type: ignore[operator]
            agent.version = step + 1
            engine.publish(step + 1)
        leftover = engine.close()
    assert statuses[RolloutStatus.TIMEOUT.value] >= 2  # the stalls, each at its deadline
    assert statuses[RolloutStatus.OK.value] > 0
    assert len(handed) == len(set(handed)) == 24
    assert not set(handed) & set(leftover.requeue)
    started = set(handed) | set(leftover.requeue)
    assert started == set(range(leftover.next_index))  # every group started is accounted for
    assert max(ahead) > 0  # episodes of later steps were playing while the learner learned


def test_a_step_does_not_take_a_fresher_group_that_would_leave_a_later_one_overdue(
    serve: Any,
) -> None:
    """K = 2, one group per step: groups 0 and 1 (version 0) play for a second, the others
    a moment. Step 0 takes group 2; at step 1 only group 3 (version 1) is finished, and
    taking it would leave groups 0 and 1 both due at step 2, which takes one: the other
    would be trained 3 versions late. So step 1 waits for group 0, and no group is ever
    trained more than K versions after it started."""
    slow, fast = [1.0], [0.01]
    agent = Agent({"t0": slow, "t1": slow, "t2": fast, "t3": fast, "t4": fast, "t5": fast})
    client = serve(agent)
    taken: list[tuple[int, int, int]] = []
    with client:
        options = EngineOptions(num_generations=1, groups_per_step=1, max_staleness=2)
        with RolloutEngine(client, rows(6), options, eos_token_id=EOS) as engine:
            for step in range(5):
                played = engine.next_step(timeout=10)
                taken += [(step, g.index, g.started_on) for g in played.groups]
                agent.version = step + 1
                engine.publish(step + 1)
    assert taken[:2] == [(0, 2, 0), (1, 0, 0)], taken  # step 1 waited for group 0
    assert all(step - started <= 2 for step, _, started in taken), taken
    assert sorted(index for _, index, _ in taken) == [0, 1, 2, 3, 4]


def test_keeps_bound_counts_what_later_steps_can_take() -> None:
    """The rule itself: versions of the untrained groups against the slots of later steps."""
    # K=2, one group a step, at step 1: two version-0 groups still untrained besides the one
    # taken; taking a version-1 group leaves both due at step 2
    assert not keeps_bound([1], [0, 0, 1], step=1, max_staleness=2, groups_per_step=1)
    assert keeps_bound([0], [0, 0, 1], step=1, max_staleness=2, groups_per_step=1)
    # two groups a step have room for both at step 2
    assert keeps_bound([1, 1], [0, 0, 1, 1], step=1, max_staleness=2, groups_per_step=2)
    assert keeps_bound([], [], step=0, max_staleness=2, groups_per_step=1)


def test_groups_with_failures_are_handed_out_whole(serve: Any) -> None:
    agent = Agent({"t0": [0.01], "t1": [0.01]}, errors=frozenset({"t1"}))
    client = serve(agent)
    with (
        client,
        RolloutEngine(
            client, rows(2), EngineOptions(num_generations=4, groups_per_step=2), eos_token_id=EOS
        ) as engine,
    ):
        played = engine.next_step()
    by_row = {g.row.row_id: g for g in played.groups}
    assert by_row["t0"].ok == 4
    assert by_row["t1"].ok == 2  # still a group: two OK members give it a baseline
    assert [r.status for r in by_row["t1"].rollouts].count(RolloutStatus.AGENT_ERROR) == 2


def test_close_drains_or_cancels_and_a_resumed_engine_plays_the_rest_first(serve: Any) -> None:
    agent = Agent({"t0": [0.01], "t1": [0.4], "t2": [0.4]})
    client = serve(agent)
    with client:
        engine = RolloutEngine(
            client,
            rows(3),
            EngineOptions(num_generations=2, groups_per_step=1, max_staleness=2),
            eos_token_id=EOS,
        ).start()
        engine.next_step()  # group 0 (fast); groups 1 and 2 are playing
        cancelled = engine.close()
        assert not cancelled.drained and cancelled.cancelled == 4
        assert cancelled.requeue == (1, 2) and cancelled.next_index == 3

        resumed = RolloutEngine(
            client,
            rows(3),
            EngineOptions(num_generations=2, groups_per_step=1, max_staleness=2),
            eos_token_id=EOS,
            requeue=cancelled.requeue,
            next_index=cancelled.next_index,
        ).start()
        first = resumed.next_step()
        drained = resumed.close(drain=True)
        assert drained.drained and drained.cancelled == 0
        assert {g.index for g in drained.finished} == set(drained.requeue)
        # the pacing let three groups start: the two requeued ones and group 3
        assert {first.groups[0].index, *drained.requeue} == {1, 2, 3}
        assert drained.next_index == 4


def test_a_step_that_can_never_fill_says_publish(serve: Any) -> None:
    client = serve(Agent({"t0": [0.01]}))
    with (
        client,
        RolloutEngine(
            client, rows(1), EngineOptions(num_generations=2, groups_per_step=1), eos_token_id=EOS
        ) as engine,
    ):
        engine.next_step()
        with pytest.raises(EngineStalledError, match="call publish"):
            engine.next_step(timeout=5)
        engine.publish(1)
        with pytest.raises(ConfigError, match="does not follow 1"):
            engine.publish(1)
        assert engine.next_step(timeout=5).groups[0].index == 1


def test_wait_for_publish_waits_for_another_threads_publish_and_close_ends_the_wait(
    serve: Any,
) -> None:
    """A learner that publishes from another thread (a trainer callback) while this one
    prefetches: the step waits for the publish instead of calling it a stall; closing the
    engine ends a wait with ``EngineClosedError``, never a hang, and only once the other
    thread's ``close`` has finished, so the client may close at once (it once raced it)."""
    from nemogym_sdk import EngineClosedError

    client = serve(Agent({"t0": [0.01]}))
    closes: list[Any] = []

    def close() -> None:
        try:
            closes.append(engine.close())
        except BaseException as error:  # noqa: BLE001 - the test reports it
            closes.append(error)

    with client:
        engine = RolloutEngine(
            client, rows(1), EngineOptions(num_generations=2, groups_per_step=1), eos_token_id=EOS
        ).start()
        engine.next_step()
        threading.Timer(0.3, engine.publish, args=(1,)).start()
        began = time.monotonic()
        step = engine.next_step(timeout=10, wait_for_publish=True)
        assert step.groups[0].index == 1 and time.monotonic() - began >= 0.25
        with pytest.raises(TimeoutError):
            engine.next_step(timeout=0.2, wait_for_publish=True)
        closer = threading.Timer(0.3, close)
        closer.start()
        with pytest.raises(EngineClosedError, match="closed while step 2 waited"):
            engine.next_step(timeout=10, wait_for_publish=True)
    closer.join(timeout=10)
    assert len(closes) == 1 and closes[0].requeue == (), closes


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_generations": 0}, "num_generations must be an integer >= 1, got 0"),
        ({"groups_per_step": 2.5}, "groups_per_step must be an integer >= 1, got 2.5"),
        ({"max_staleness": -1}, "max_staleness must be >= 0, got -1"),
        ({"max_inflight": 3}, "max_inflight=3 cannot hold one group of num_generations=4"),
        ({"episode_timeout": 0}, "episode_timeout must be > 0 seconds, got 0"),
    ],
)
def test_bad_settings_are_config_errors_that_show_the_value(
    kwargs: dict[str, Any], message: str
) -> None:
    settings: dict[str, Any] = {"num_generations": 4, "groups_per_step": 1}
    settings.update(kwargs)
    with pytest.raises(ConfigError, match=re.escape(message)):
        EngineOptions(**settings)


def test_options_fill_the_pacing_by_default_and_the_engine_takes_only_the_record() -> None:
    options = EngineOptions(num_generations=4, groups_per_step=3, max_staleness=1)
    assert options.inflight == 2 * 3 * 4
    assert EngineOptions(num_generations=4, groups_per_step=3, max_inflight=8).inflight == 8
    with pytest.raises(ConfigError, match="options must be an EngineOptions, got dict"):
        RolloutEngine(
            AgentClient({"a": "http://127.0.0.1:9"}),
            rows(1),
            {"num_generations": 4},  # type: ignore[arg-type]
            eos_token_id=EOS,
        )


def test_wrong_order_calls_are_usage_errors() -> None:
    engine = RolloutEngine(
        AgentClient({"a": "http://127.0.0.1:9"}),
        rows(1),
        EngineOptions(num_generations=2, groups_per_step=1),
        eos_token_id=EOS,
    )
    with pytest.raises(UsageError, match="start"):
        engine.next_step(timeout=1)


def test_cut_stragglers_hands_a_due_group_out_once_two_are_ok(serve: Any) -> None:
    """One episode of the group stalls: with cut_stragglers the step does not wait for its
    deadline; what was still playing comes out as TIMEOUT failures saying why, in place."""
    agent = Agent({"t0": [0.01, 0.01, 0.01, STALL_S]})
    client = serve(agent)
    options = EngineOptions(
        num_generations=4, groups_per_step=1, episode_timeout=4 * STALL_S, cut_stragglers=True
    )
    with client, RolloutEngine(client, rows(1), options, eos_token_id=EOS) as engine:
        played = engine.next_step(timeout=2 * STALL_S)
        assert played.waited_s < STALL_S / 2  # not the stall's length
        (group,) = played.groups
        assert group.ok >= 2  # handed out as soon as two were OK
        cut = [r for r in group.rollouts if not r.ok]
        assert 1 <= len(cut) <= 2  # the stall, and perhaps a fast one not done yet
        for rollout in cut:
            assert rollout.status is RolloutStatus.TIMEOUT
            assert rollout.error is not None and rollout.error.startswith("cut: still playing")
            assert rollout.row_id == "t0" and rollout.repeat_index is not None
        assert sorted(r.repeat_index for r in group.rollouts) == [0, 1, 2, 3]  # type: ignore[type-var]
        assert played.metrics()["engine_cut_episodes"] == float(len(cut))
        engine.publish(1)
        assert engine.next_step(timeout=STALL_S).groups[0].index == 1  # the engine goes on
