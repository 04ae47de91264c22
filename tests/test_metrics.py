"""The step metrics every trainer logs: ``RolloutStats`` of a batch, merged across ranks."""

from __future__ import annotations

import math

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nemogym_sdk import Rollout, RolloutStats, RolloutStatus, collate, compute_advantages
from nemogym_sdk.testing.batches import grouped_rollouts


def _rollout(row: str, reward: float, status: RolloutStatus = RolloutStatus.OK) -> Rollout:
    """Prompt [1 2]; completion [5 6 | 9 | 7] (policy, environment, policy): 2 turns."""
    if status is not RolloutStatus.OK:
        return attrs.evolve(Rollout.failed(status, 2, error="boom"), row_id=row)
    return Rollout(
        prompt_ids=[1, 2],
        completion_ids=[5, 6, 9, 7],
        env_mask=[1, 1, 0, 1],
        logprobs=[-0.1, -0.2, 0.0, -0.3],
        reward=reward,
        num_turns=2,
        row_id=row,
    )


def test_one_batch() -> None:
    """Group a: rewards 1, 0 and a timeout; group b: 1, 1 (zero spread); group c: one OK
    (degenerate). Tokens count OK samples only: 3 policy and 1 environment token each."""
    rollouts = [
        _rollout("a", 1.0),
        _rollout("a", 0.0),
        _rollout("a", 0.0, RolloutStatus.TIMEOUT),
        _rollout("b", 1.0),
        _rollout("b", 1.0),
        _rollout("c", 0.5),
        _rollout("c", 0.0, RolloutStatus.DRIFT),
    ]
    metrics = RolloutStats.of(collate(rollouts, pad_token_id=0)).as_metrics()
    assert metrics["rollouts"] == 7 and metrics["ok"] == 5
    assert metrics["failures"] == {"timeout": 1, "drift": 1}
    assert metrics["ok_fraction"] == pytest.approx(5 / 7)
    assert metrics["reward_mean"] == pytest.approx(3.5 / 5)
    assert metrics["reward_std"] == pytest.approx(math.sqrt(3.25 / 5 - 0.7**2))
    assert (metrics["turns_mean"], metrics["policy_tokens"], metrics["env_tokens"]) == (2.0, 15, 5)
    assert (metrics["groups"], metrics["degenerate_groups"], metrics["zero_spread_groups"]) == (
        3,
        1,
        1,
    )
    assert metrics["partial_groups"] == 2  # a and c each lost an episode


def test_no_ok_rollout_reports_nan_rewards() -> None:
    stats = RolloutStats.of(collate([_rollout("a", 0, RolloutStatus.EMPTY)], pad_token_id=0))
    assert math.isnan(stats.reward_mean) and math.isnan(stats.reward_std)
    assert stats.as_metrics()["failures"] == {"empty": 1}


@settings(max_examples=60, deadline=None)
@given(rollouts=grouped_rollouts(), cut=st.integers(0, 100))
def test_ranks_merge_to_the_whole_batch(rollouts: list[Rollout], cut: int) -> None:
    """Split between two 'ranks' at a group boundary, the merged stats are the stats of the
    whole batch: every field is a sum, and groups never span ranks."""
    groups = list(dict.fromkeys(r.row_id for r in rollouts))
    first = set(groups[: cut % (len(groups) + 1)])
    parts = [[r for r in rollouts if (r.row_id in first) == side] for side in (True, False)]
    whole = RolloutStats.of(collate(rollouts, pad_token_id=0))
    stats = [RolloutStats.of(collate(p, pad_token_id=0)) for p in parts if p]
    merged = RolloutStats.merge(stats)
    assert merged.episodes == whole.episodes and merged.statuses == whole.statuses
    assert (merged.groups, merged.degenerate_groups, merged.zero_spread_groups) == (
        whole.groups,
        whole.degenerate_groups,
        whole.zero_spread_groups,
    )
    assert (merged.policy_tokens, merged.env_tokens) == (whole.policy_tokens, whole.env_tokens)
    assert merged.ok_reward_sum == pytest.approx(whole.ok_reward_sum)
    advantages = compute_advantages(collate(rollouts, pad_token_id=0))
    assert whole.degenerate_groups == advantages.stats.degenerate_groups
