"""The kit's fake NeMo Gym agent, driven by the SDK's real AgentClient over loopback HTTP."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import aiohttp
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nemogym_sdk import AgentClient, RetryPolicy, RolloutStatus, Timeouts
from nemogym_sdk.testing import Episode, FakeAgent, Fault, FaultScript, always, burst, episodes
from nemogym_sdk.testing.fake_agent import REPEAT_IS_FINAL, RETRYABLE, fake_agent
from tests.fakes import SINGLE_TURN

EOS = 2
FAST_RETRY = RetryPolicy(max_attempts=3, base_delay=0.001, max_delay=0.01)


def _rows(n: int) -> list[dict[str, Any]]:
    return [
        {"task_id": f"t{i}", "responses_create_params": {"input": f"task {i}"}} for i in range(n)
    ]


@settings(max_examples=5, deadline=None)
@given(st.lists(episodes(drift=False, max_turns=3), min_size=3, max_size=3))
def test_generated_episodes_come_back_as_their_samples(batch: list[Episode]) -> None:
    """Each row is answered with its own generated episode, and the client's rollouts are
    exactly the episodes' ground-truth samples, through retried faults."""
    plan = {"t0": burst(Fault.HTTP_503, 1), "t1": burst(Fault.RESET, 2)}
    by_task = {f"t{i}": episode for i, episode in enumerate(batch)}
    with (
        fake_agent(lambda row: by_task[row["task_id"]], plan) as agent,
        AgentClient({"a": agent.url}, retry=FAST_RETRY, seed=0) as client,
    ):
        rollouts = client.run_sync(_rows(3), eos_token_id=EOS)
    for episode, rollout in zip(batch, rollouts, strict=True):
        assert rollout.status is RolloutStatus.OK, rollout.error
        expected = episode.expected_sample()
        assert {k: rollout.to_dict()[k] for k in expected} == expected
        assert rollout.reward == episode.reward
    assert [agent.attempts(f"t{i}") for i in range(3)] == [2, 3, 1]
    assert agent.fault_counts() == {Fault.OK: 3, Fault.HTTP_503: 1, Fault.RESET: 2}


@pytest.mark.parametrize(
    ("fault", "status"),
    [
        (Fault.HTTP_500, RolloutStatus.AGENT_ERROR),
        (Fault.HTTP_422, RolloutStatus.AGENT_ERROR),
        (Fault.RESET, RolloutStatus.TRANSPORT_ERROR),
        (Fault.RESET_MID_BODY, RolloutStatus.TRANSPORT_ERROR),
        (Fault.TRUNCATED, RolloutStatus.TRANSPORT_ERROR),
        (Fault.GARBAGE, RolloutStatus.TRANSPORT_ERROR),
        (Fault.NON_JSON, RolloutStatus.INVALID),
        (Fault.STALL, RolloutStatus.TIMEOUT),
    ],
)
def test_permanent_faults_become_typed_failures(
    nemo_gym_agent: Callable[..., FakeAgent], fault: Fault, status: RolloutStatus
) -> None:
    """The fixture's agent fails every attempt at ``t0``; ``t1`` is unaffected. Retryable
    faults are tried ``max_attempts`` times, the others once."""
    agent = nemo_gym_agent([SINGLE_TURN], {"t0": always(fault)}, stall_s=5.0)
    timeouts = Timeouts(request=0.5) if fault is Fault.STALL else Timeouts()
    with AgentClient({"a": agent.url}, retry=FAST_RETRY, timeouts=timeouts, seed=0) as client:
        failed, ok = client.run_sync(_rows(2), eos_token_id=EOS)
    assert failed.status is status, failed.error
    assert ok.status is RolloutStatus.OK
    assert ok.completion_ids.tolist() == [7, 8]
    expected_attempts = FAST_RETRY.max_attempts if fault in RETRYABLE else 1
    if fault in REPEAT_IS_FINAL:
        expected_attempts = 2  # the same 500 twice is the episode's failure, not the network's
    assert agent.attempts("t0") == (1 if fault is Fault.STALL else expected_attempts)


async def test_the_plan_default_and_the_log(nemo_gym_agent: Callable[..., FakeAgent]) -> None:
    """``default`` applies to rows the plan does not name; the log keeps each request's body
    and cookies, and raw bytes are served as they are."""
    agent = nemo_gym_agent(
        [b'{"response": {"output": []}, "reward": 0.5}'],
        {"t1": FaultScript()},
        default=burst(Fault.HTTP_429, 1),
        retry_after=0.0,
    )
    async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as session:
        for task in ("t0", "t0", "t1"):
            async with session.post(f"{agent.url}/run", json={"task_id": task}) as response:
                statuses = [response.status]
                body = await response.read()
        assert statuses == [200]
        assert body == b'{"response": {"output": []}, "reward": 0.5}'
    records = agent.records()
    assert [(r.key, r.attempt, r.fault) for r in records] == [
        ("t0", 1, Fault.HTTP_429),
        ("t0", 2, Fault.OK),
        ("t1", 1, Fault.OK),
    ]
    assert records[0].body == {"task_id": "t0"}
    assert records[2].cookies == {"session": "t0-2"}  # the session kept the agent's cookie
    assert agent.in_flight.current == 0 and agent.in_flight.peak >= 1


def test_an_empty_response_list_is_refused() -> None:
    """Serving nothing is a mistake in the test, said at once."""
    with pytest.raises(ValueError, match="at least one response"), fake_agent([]):
        pass
