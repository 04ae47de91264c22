"""``RolloutEngine`` on a real NeMo Gym environment with heavy-tailed episode lengths and
occasional stalls: ``target_chars`` rows with a ``latency`` field (Pareto delays before each
step's answer, stalls far beyond the episode deadline), played by NeMo Gym's own agent and
model server against the scripted ``nemogym_sdk.serve`` backend."""

from __future__ import annotations

import collections

import pytest

from nemogym_sdk import AgentClient, EngineOptions, RolloutEngine, RolloutStatus, TaskRow, load_rows
from nemogym_sdk.gym import GymStack

from .stacks import StackFactory

pytestmark = [pytest.mark.gym, pytest.mark.slow]

DEADLINE_S = 3.0
LATENCY = {"scale_s": 0.01, "alpha": 1.1, "cap_s": 1.0, "stall_p": 0.08, "stall_s": 30.0}


def test_no_step_waits_past_a_deadline_and_no_row_is_lost_or_counted_twice(
    stack_factory: StackFactory,
) -> None:
    """6 steps of 2 groups x 4, K = 1, a 3 s episode deadline, stalls of 30 s: each step
    comes within a few deadlines, every group is handed out once or left over, and the
    stalls end as TIMEOUT failures."""
    stack: GymStack = stack_factory(["target_chars"]).start()
    rows = [
        row.data | {"latency": LATENCY}
        for row in load_rows(stack.train_paths["target_chars"], seed=0)[:8]
    ]
    statuses: collections.Counter[str] = collections.Counter()
    handed: list[int] = []
    with AgentClient(stack.directory) as client:
        tasks = [TaskRow(row_id=f"row{i}", data=row) for i, row in enumerate(rows)]
        engine = RolloutEngine(
            client,
            tasks,
            EngineOptions(
                num_generations=4, groups_per_step=2, max_staleness=1, episode_timeout=DEADLINE_S
            ),
            eos_token_id=2,
        ).start()
        for step in range(6):
            played = engine.next_step(timeout=60)
            # a step waits at most for the deadline of the episodes it must include (plus
            # the time to play them): never for a stall's 30 s
            assert played.waited_s < 3 * DEADLINE_S, played.waited_s
            for group in played.groups:
                assert step - group.started_on <= 1
                assert len(group.rollouts) == 4
                handed.append(group.index)
                statuses.update(r.status.value for r in group.rollouts)
            engine.publish(step + 1)
        leftover = engine.close()
    assert len(handed) == len(set(handed)) == 12  # every group once
    assert set(handed) | set(leftover.requeue) == set(range(leftover.next_index))
    assert not set(handed) & set(leftover.requeue)
    assert statuses[RolloutStatus.OK.value] > 0
    assert statuses[RolloutStatus.TIMEOUT.value] > 0, statuses  # the stalls hit deadlines
    assert set(statuses) <= {RolloutStatus.OK.value, RolloutStatus.TIMEOUT.value}, statuses
