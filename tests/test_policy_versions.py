"""The policy version of every model turn: the envelope, the parser, the batch."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from nemogym_sdk import DriftPolicy, Rollout, RolloutStatus, collate, parse_agent_response
from nemogym_sdk.wire import (
    POLICY_VERSION_PREFIX,
    ROUTED_EXPERTS,
    policy_version_envelope,
    read_policy_version,
)

EOS = 2


def turn(prompt: list[int], gen: list[int], routed: Any = None) -> dict[str, Any]:
    item: dict[str, Any] = {
        "type": "function_call",
        "name": "tool",
        "arguments": "{}",
        "prompt_token_ids": prompt,
        "generation_token_ids": gen,
        "generation_log_probs": [-0.5] * len(gen),
    }
    if routed is not None:
        item[ROUTED_EXPERTS] = routed
    return item


def run(*items: dict[str, Any]) -> dict[str, Any]:
    return {"response": {"output": list(items)}, "reward": 1.0}


def v(version: int) -> str:
    return policy_version_envelope(version)


def test_the_envelope_round_trips_and_refuses_what_is_not_ours() -> None:
    assert read_policy_version(v(0)) == 0
    assert read_policy_version(v(1234)) == 1234
    assert v(7) == f"{POLICY_VERSION_PREFIX}7"
    # a MoE backend's real routing data, another framework's envelope, junk: no version
    for other in (
        [[[1, 2]]],
        "nrlre1:int16:2x1x2:AAAA",
        f"{POLICY_VERSION_PREFIX}-1",
        f"{POLICY_VERSION_PREFIX}",
        f"{POLICY_VERSION_PREFIX}٣",
        None,
        3,
    ):
        assert read_policy_version(other) is None, other
    for bad in (-1, True, 1.0):
        with pytest.raises(ValueError, match="policy version"):
            policy_version_envelope(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("as_bytes", [False, True], ids=["dict", "json-bytes"])
def test_each_turn_keeps_the_version_that_generated_it(as_bytes: bool) -> None:
    """turn 0 by v3 [10 11], env [50], turn 1 by v4 [20], env [60 61], turn 2 unknown [30 31]

    versions per completion token: [3 3 -1 4 -1 -1 -1 -1]
    """
    result = run(
        turn([1, 2], [10, 11], v(3)),
        turn([1, 2, 10, 11, 50], [20], v(4)),
        turn([1, 2, 10, 11, 50, 20, 60, 61], [30, 31]),
    )
    rollout = parse_agent_response(json.dumps(result).encode() if as_bytes else result, EOS)
    assert rollout.status is RolloutStatus.OK
    assert rollout.turn_versions == (3, 4, None)
    assert rollout.versions is not None
    assert rollout.versions.tolist() == [3, 3, -1, 4, -1, -1, -1, -1]
    assert not rollout.versions.flags.writeable
    assert rollout.oldest_version == 3


def test_no_version_anywhere_means_none_not_a_guess() -> None:
    rollout = parse_agent_response(run(turn([1], [5], [[[0, 1]]]), turn([1, 5, 6], [7])), EOS)
    assert rollout.turn_versions == (None, None)
    assert rollout.versions is None
    assert rollout.oldest_version is None
    failed = parse_agent_response({"error": "boom"}, EOS)
    assert failed.turn_versions == () and failed.versions is None


def test_truncation_and_forks_carry_their_own_versions() -> None:
    """A fork at a drift keeps the versions of its own turns; a cut keeps the cut's."""
    result = run(turn([1, 2], [10, 11], v(1)), turn([9, 9], [20, 21, 22], v(2)))
    forked = parse_agent_response(result, EOS, on_drift=DriftPolicy.FORK)
    assert forked.turn_versions == (1,) and forked.versions.tolist() == [1, 1]  # type: ignore[union-attr]
    (fork,) = forked.forks
    assert fork.turn_versions == (2,) and fork.versions.tolist() == [2, 2, 2]  # type: ignore[union-attr]
    cut = parse_agent_response(
        run(turn([1], [10, 11], v(5)), turn([1, 10, 11, 40], [20, 21], v(6))),
        EOS,
        max_completion_length=4,
    )
    assert cut.truncated and cut.versions.tolist() == [5, 5, -1, 6]  # type: ignore[union-attr]


def test_a_versions_array_of_the_wrong_length_is_refused() -> None:
    with pytest.raises(ValueError, match="versions has 1 entries for 2"):
        Rollout(
            prompt_ids=[1],
            completion_ids=[4, 5],
            env_mask=[1, 1],
            logprobs=[0.0, 0.0],
            reward=1.0,
            versions=[3],
        )


def test_the_batch_exposes_versions_oldest_per_row_and_staleness() -> None:
    """Rows: versions [3 3 -1 4] (OK), unknown (OK), [2] but DRIFT, a failure."""
    fresh = parse_agent_response(
        run(turn([1], [10, 11], v(3)), turn([1, 10, 11, 7], [20], v(4))), EOS
    )
    unknown = parse_agent_response(run(turn([1], [10])), EOS)
    drifted = parse_agent_response(run(turn([1], [10], v(2)), turn([8], [20], v(2))), EOS)
    assert drifted.status is RolloutStatus.DRIFT
    failed = parse_agent_response({"error": "x"}, EOS)
    batch = collate([fresh, unknown, drifted, failed], pad_token_id=0)
    assert batch.versions.tolist() == [
        [3, 3, -1, 4],
        [-1, -1, -1, -1],
        [2, -1, -1, -1],
        [-1, -1, -1, -1],
    ]
    assert batch.oldest_versions.tolist() == [3, -1, 2, -1]
    # learner at version 5: tokens by v3 are 2 behind, by v4 1; only loss tokens count
    staleness = batch.staleness(5)
    assert staleness.tolist()[0] == [2, 2, -1, 1]
    assert (staleness[1:] == -1).all()  # no version, DRIFT and failure rows: not counted
    assert np.array_equal(batch.staleness(4)[0], [1, 1, -1, 0])


def test_step_metrics_count_tokens_by_staleness() -> None:
    """Learner at version 5: two tokens by v3 (2 behind), one by v4 (1 behind), and one
    token of an OK row that reports no version; merged over two ranks, counts add up."""
    from nemogym_sdk import RolloutStats

    fresh = parse_agent_response(
        run(turn([1], [10, 11], v(3)), turn([1, 10, 11, 7], [20], v(4))), EOS, row_id="a"
    )
    unknown = parse_agent_response(run(turn([1], [10])), EOS, row_id="b")
    batch = collate([fresh, unknown], pad_token_id=0)
    stats = RolloutStats.of(batch, learner_version=5)
    assert stats.staleness == {"1": 1, "2": 2} and stats.unversioned_tokens == 1
    metrics = stats.as_metrics()
    assert metrics["staleness"] == {"1": 1, "2": 2}
    assert metrics["staleness_mean"] == pytest.approx(5 / 3)
    assert metrics["staleness_max"] == 2 and metrics["unversioned_tokens"] == 1
    merged = RolloutStats.merge([stats, stats])
    assert merged.staleness == {"1": 2, "2": 4} and merged.unversioned_tokens == 2
    assert RolloutStats.of(batch).as_metrics()["staleness"] == {}  # no learner version given
