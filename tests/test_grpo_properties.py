"""Properties of group-relative advantages.

Order and failures must not matter (the implementation promises bit-for-bit equality:
sums run over each group's OK rewards sorted by value), shifting a group's rewards
must not matter (up to rounding, checked on the exact 1/8 reward grid), and a
non-degenerate group's advantages sum to 0.
"""

from __future__ import annotations

import math
from typing import Any

import attrs
import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from nemogym_sdk import Rollout, RolloutStatus, collate
from nemogym_sdk.grpo import Aggregation, Scaling, compute_advantages, group_advantages
from nemogym_sdk.testing import (
    BINARY_OR_GRID,
    FAILED_STATUSES,
    GRID_REWARDS,
    REWARDS,
    RewardGroups,
    grouped_rollouts,
    reward_groups,
    scored_rollout,
)

from .thread_ranks import run_ranks

pytestmark = pytest.mark.property

SCALES = st.sampled_from(list(Scaling))
OPTIONS = st.fixed_dictionaries({"scale": SCALES, "leave_one_out": st.booleans()})


def _advantages(data: RewardGroups, **options: Any) -> np.ndarray[Any, np.dtype[np.float64]]:
    return group_advantages(data.rewards, data.groups, data.ok, **options)


def _reorder(data: RewardGroups, order: list[int]) -> RewardGroups:
    return RewardGroups(
        rewards=tuple(data.rewards[i] for i in order),
        groups=tuple(data.groups[i] for i in order),
        ok=tuple(data.ok[i] for i in order),
    )


@given(data=reward_groups(), options=OPTIONS, draw=st.data())
def test_permuting_a_group_permutes_its_advantages(
    data: RewardGroups, options: dict[str, Any], draw: st.DataObject
) -> None:
    """(a) Shuffling the rollouts inside one group shuffles their advantages the same way
    and leaves every other advantage as it was, bit for bit."""
    group = draw.draw(st.sampled_from(sorted(set(data.groups))))
    slots = data.members(group)
    moved = draw.draw(st.permutations(slots))
    order = list(range(len(data)))
    for slot, source in zip(slots, moved, strict=True):
        order[slot] = source  # position `slot` now holds the rollout from `source`
    before = _advantages(data, **options)
    after = _advantages(_reorder(data, order), **options)
    assert after.tolist() == before[order].tolist()


@given(data=reward_groups(), options=OPTIONS, draw=st.data())
def test_any_order_of_the_batch_gives_the_same_advantages(
    data: RewardGroups, options: dict[str, Any], draw: st.DataObject
) -> None:
    """(a') Any reordering of the whole batch (groups interleaved differently) permutes the
    advantages with it: results do not depend on the order rollouts completed in."""
    order = draw.draw(st.permutations(range(len(data))))
    before = _advantages(data, **options)
    after = _advantages(_reorder(data, order), **options)
    assert after.tolist() == before[order].tolist()


@given(
    data=reward_groups(rewards=BINARY_OR_GRID),
    shift=GRID_REWARDS.map(lambda r: 10 * r),
    options=OPTIONS,
    draw=st.data(),
)
def test_shifting_a_groups_rewards_changes_no_advantage(
    data: RewardGroups, shift: float, options: dict[str, Any], draw: st.DataObject
) -> None:
    """(b) Adding a constant to every reward of one group (of every group under ``batch``
    scaling, whose std spans groups) changes no advantage."""
    if options["scale"] is Scaling.BATCH:
        shifted = set(data.groups)
    else:
        shifted = {draw.draw(st.sampled_from(sorted(set(data.groups))))}
    rewards = tuple(
        r + shift if g in shifted else r for r, g in zip(data.rewards, data.groups, strict=True)
    )
    before = _advantages(data, **options)
    after = _advantages(attrs.evolve(data, rewards=rewards), **options)
    np.testing.assert_allclose(after, before, rtol=1e-9, atol=1e-9)


@given(
    data=reward_groups(),
    junk=st.lists(REWARDS | st.sampled_from([math.nan, math.inf, -math.inf, 1e300])),
    extra=st.lists(st.tuples(st.integers(0, 6), st.integers(0, 100), REWARDS), max_size=6),
    options=OPTIONS,
)
def test_failed_rollouts_never_move_another_advantage(
    data: RewardGroups,
    junk: list[float],
    extra: list[tuple[int, int, float]],
    options: dict[str, Any],
) -> None:
    """(c) Giving failed rollouts other rewards (even NaN), adding failed rollouts to old or
    new groups at any position, or removing every failed rollout leaves each OK rollout's
    advantage bit for bit as it was; failed rollouts always get 0."""
    base = _advantages(data, **options)
    ok_N = np.array(data.ok)
    assert (base[~ok_N] == 0.0).all()
    expected_ok = base[ok_N].tolist()

    failed = [i for i in range(len(data)) if not data.ok[i]]
    rewards = list(data.rewards)
    for i, value in zip(failed, junk, strict=False):
        rewards[i] = value
    assert _advantages(attrs.evolve(data, rewards=tuple(rewards)), **options)[ok_N].tolist() == (
        expected_ok
    )

    kept = [i for i in range(len(data)) if data.ok[i]]
    assert _advantages(_reorder(data, kept), **options).tolist() == expected_ok

    entries = list(zip(data.rewards, data.groups, data.ok, strict=True))
    for group, position, reward in extra:
        entries.insert(position % (len(entries) + 1), (reward, f"row:{group}", False))
    grown = RewardGroups(
        rewards=tuple(e[0] for e in entries),
        groups=tuple(e[1] for e in entries),
        ok=tuple(e[2] for e in entries),
    )
    assert _advantages(grown, **options)[np.array(grown.ok)].tolist() == expected_ok


@given(data=reward_groups(), scale=SCALES)
def test_advantages_of_a_group_sum_to_zero(data: RewardGroups, scale: Scaling) -> None:
    """(d) Without leave-one-out, the OK advantages of every group sum to ~0 (exactly 0 in
    degenerate and zero-spread groups), whatever the scaling."""
    values = _advantages(data, scale=scale)
    for group in set(data.groups):
        members = data.ok_members(group)
        total = math.fsum(values[members].tolist())
        largest = max((abs(values[i]) for i in members), default=0.0)
        assert abs(total) <= 1e-12 + 1e-9 * len(members) * largest
        if len(members) < 2 or len({data.rewards[i] for i in members}) == 1:
            assert all(values[i] == 0.0 for i in members)


@given(data=reward_groups(), draw=st.data())
def test_leave_one_out_is_a_rescaled_plain_advantage(
    data: RewardGroups, draw: st.DataObject
) -> None:
    """Leave-one-out equals n/(n-1) times the plain advantage (n = OK episodes of the group),
    so it also sums to 0 within a group."""
    scale = draw.draw(SCALES)
    plain = _advantages(data, scale=scale)
    loo = _advantages(data, scale=scale, leave_one_out=True)
    for group in set(data.groups):
        members = data.ok_members(group)
        n = len(members)
        for i in members:
            expected = plain[i] * n / (n - 1) if n >= 2 else 0.0
            assert loo[i] == pytest.approx(expected, rel=1e-9, abs=1e-9)


@given(rollouts=grouped_rollouts(), options=OPTIONS)
def test_batch_level_agrees_with_the_array_level(
    rollouts: list[Rollout], options: dict[str, Any]
) -> None:
    """``compute_advantages`` on a collated batch gives ``group_advantages`` of its rewards
    (as float32), 0 on failures, NaN rewards on failures, and consistent counts."""
    batch = collate(rollouts, pad_token_id=0)
    adv = compute_advantages(batch, **options)
    ok = [r.ok for r in rollouts]
    expected = group_advantages(
        [float(np.float32(r.reward)) for r in rollouts], [r.row_id for r in rollouts], ok, **options
    )
    assert adv.values.tolist() == expected.astype(np.float32).tolist()
    assert np.isnan(adv.rewards[~np.array(ok)]).all()
    stats = adv.stats
    assert stats.num_groups == len({r.row_id for r in rollouts}) == adv.group_index.max() + 1
    assert stats.num_episodes == len(rollouts)
    assert stats.ok_episodes == sum(ok)
    assert stats.degenerate_groups + stats.zero_spread_groups <= stats.num_groups


@given(
    rollouts=grouped_rollouts(),
    extra=st.lists(st.tuples(st.integers(0, 6), st.integers(0, 100), FAILED_STATUSES), max_size=4),
    scale=SCALES,
)
def test_failed_rollouts_in_a_batch_never_move_ok_advantages(
    rollouts: list[Rollout], extra: list[tuple[int, int, RolloutStatus]], scale: Scaling
) -> None:
    """(c) on whole batches: adding failed rollouts keeps every OK row's advantage."""
    before = compute_advantages(collate(rollouts, pad_token_id=0), scale=scale)
    grown = list(rollouts)
    for group, position, status in extra:
        failure = scored_rollout(f"row:{group}", 0.0, repeat_index=9, status=status)
        grown.insert(position % (len(grown) + 1), failure)
    after = compute_advantages(collate(grown, pad_token_id=0), scale=scale)
    assert after.values[np.asarray(collate(grown, pad_token_id=0).ok)].tolist() == (
        before.values[np.asarray(collate(rollouts, pad_token_id=0).ok)].tolist()
    )


@given(rollouts=grouped_rollouts(), copies=st.lists(st.integers(0, 2), min_size=1))
def test_forks_share_their_episodes_advantage(rollouts: list[Rollout], copies: list[int]) -> None:
    """Giving rollouts OK forks (with unrelated rewards) changes no episode's advantage, and
    every fork row gets its episode's advantage."""
    plain = compute_advantages(collate(rollouts, pad_token_id=0))
    forked = [
        attrs.evolve(r, forks=tuple(attrs.evolve(r, reward=-7.0) for _ in range(n))) if r.ok else r
        for r, n in zip(rollouts, copies + [0] * len(rollouts), strict=False)
    ]
    batch = collate(forked, pad_token_id=0)
    adv = compute_advantages(batch)
    assert adv.stats.num_episodes == len(rollouts) and adv.stats.num_rows == len(batch)
    assert adv.values.tolist() == plain.values[batch.episode_index].tolist()


@given(rollouts=grouped_rollouts(), weights=st.tuples(REWARDS, REWARDS))
def test_gdpo_advantages_of_a_group_sum_to_zero(
    rollouts: list[Rollout], weights: tuple[float, float]
) -> None:
    """GDPO without batch norm: every component's group advantages sum to 0, so their
    weighted sum does too; with batch norm the batch's OK advantages sum to ~0."""
    with_components = [
        attrs.evolve(r, reward_components={"a": r.reward, "b": (r.reward * 3) % 2})
        for r in rollouts
    ]
    batch = collate(with_components, pad_token_id=0)
    reward_weights = {"a": weights[0], "b": weights[1]}
    for batch_norm in (False, True):
        adv = compute_advantages(
            batch,
            reward_weights=reward_weights,
            aggregation=Aggregation.GDPO,
            gdpo_batch_norm=batch_norm,
        )
        values = adv.values.astype(np.float64)
        scale = 1.0 + np.abs(values).max()
        for g in range(adv.stats.num_groups):
            in_group = (adv.group_index == g) & np.asarray(batch.ok)
            if not batch_norm:
                assert abs(values[in_group].sum()) <= 1e-5 * scale * max(1, in_group.sum())
        assert abs(values.sum()) <= 1e-5 * scale * len(values)


@given(rollouts=grouped_rollouts(), options=OPTIONS, draw=st.data())
def test_sharded_batch_statistics_equal_the_whole_batch(
    rollouts: list[Rollout], options: dict[str, Any], draw: st.DataObject
) -> None:
    """Whole groups split over two ranks (threads sharing a real ``gather``) give, bit for
    bit, the advantages of one process on the two shards concatenated, whatever the scale
    (``batch`` is the one that needs the hook)."""
    names = sorted({str(r.row_id) for r in rollouts})
    assume(len(names) >= 2)
    cut = draw.draw(st.integers(1, len(names) - 1))
    first = [r for r in rollouts if r.row_id in names[:cut]]
    second = [r for r in rollouts if r.row_id in names[cut:]]
    shards = [collate(first, pad_token_id=0), collate(second, pad_token_id=0)]
    results = run_ranks(
        [lambda g, s=s: compute_advantages(s, gather=g, **options).values for s in shards]
    )
    whole = compute_advantages(collate(first + second, pad_token_id=0), **options)
    assert np.concatenate(results).tolist() == whole.values.tolist()
