"""Group-relative advantages, with the arithmetic of every case in its docstring.

Hand numbers use ``epsilon=0.0`` unless the test is about epsilon, so the expected
values are exact; ``values`` is float32, hence ``rel=1e-6``.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import pytest

from nemogym_sdk import Batch, ConfigError, DataError, Rollout, RolloutStats, RolloutStatus, collate
from nemogym_sdk.grpo import (
    Aggregation,
    LossType,
    PolicyLoss,
    Scaling,
    compute_advantages,
    group_advantages,
)

OK = RolloutStatus.OK
SQRT3 = math.sqrt(3.0)


def _rollout(
    row_id: str | None,
    reward: float = 0.0,
    *,
    repeat: int = 0,
    status: RolloutStatus = OK,
    components: dict[str, float] | None = None,
    forks: tuple[Rollout, ...] = (),
) -> Rollout:
    """An OK rollout ([5] -> [7]) or a failed one (seed shape), tagged with its row."""
    if status is OK:
        rollout = Rollout(
            prompt_ids=[5],
            completion_ids=[7],
            env_mask=[1],
            logprobs=[-0.5],
            reward=reward,
            reward_components=components or {},
            forks=forks,
        )
    else:
        rollout = Rollout.failed(
            status, 2, error="boom", reward=reward, reward_components=components
        )
    return attrs.evolve(rollout, row_id=row_id, repeat_index=repeat)


def _group(row_id: str, *rewards: float | None) -> list[Rollout]:
    """One group; ``None`` is a TIMEOUT failure (placeholder reward 0.0)."""
    return [
        _rollout(row_id, 0.0, repeat=i, status=RolloutStatus.TIMEOUT)
        if r is None
        else _rollout(row_id, r, repeat=i)
        for i, r in enumerate(rewards)
    ]


def _batch(*rollouts: Rollout) -> Batch:
    return collate(rollouts, pad_token_id=0)


def _values(batch: Batch, **kwargs: Any) -> list[float]:
    kwargs.setdefault("epsilon", 0.0)
    return [float(v) for v in compute_advantages(batch, **kwargs).values]


# --- single reward ---------------------------------------------------------------------


def test_group_scaling_standard_grpo() -> None:
    """group [1, 0, 1, 1] -> mean .75, std(ddof=1) .5 -> [.5, -1.5, .5, .5]."""
    assert _values(_batch(*_group("r", 1, 0, 1, 1))) == pytest.approx([0.5, -1.5, 0.5, 0.5])


def test_epsilon_is_added_to_the_std() -> None:
    """[1, 0, 1, 1] with eps .5: deviations [.25, -.75, .25, .25] / (.5 + .5) = same."""
    values = _values(_batch(*_group("r", 1, 0, 1, 1)), epsilon=0.5)
    assert values == pytest.approx([0.25, -0.75, 0.25, 0.25])
    default = compute_advantages(_batch(*_group("r", 1, 0, 1, 1))).values
    assert default.tolist() == pytest.approx(
        [0.5 / 1.000002, -1.5 / 1.000002] + [0.5 / 1.000002] * 2
    )


def test_failures_are_excluded_not_zero_rewards() -> None:
    """[1, 0, fail, 1]: OK [1, 0, 1] -> mean 2/3, std sqrt(1/3) -> [1/sqrt3, -2/sqrt3, 0, 1/sqrt3].

    Treating the failure as reward 0 would give [1, 0, 0, 1] -> [.866, -.866, -.866, .866].
    """
    values = _values(_batch(*_group("r", 1, 0, None, 1)))
    assert values == pytest.approx([1 / SQRT3, -2 / SQRT3, 0.0, 1 / SQRT3], rel=1e-6)


def test_a_failed_rollouts_reward_is_never_read() -> None:
    """A failure carrying reward 100 changes nothing: [1, 0, fail] -> [.707, -.707, 0]."""
    rollouts = [*_group("r", 1, 0), _rollout("r", 100.0, repeat=2, status=RolloutStatus.EMPTY)]
    assert _values(_batch(*rollouts)) == pytest.approx([0.5**0.5, -(0.5**0.5), 0.0], rel=1e-6)


def test_all_failed_group_is_degenerate_and_zero() -> None:
    """Group a [fail, fail] is all zeros; group b [2, 4] -> mean 3, std sqrt2 -> [-.707, .707]."""
    batch = _batch(*_group("a", None, None), *_group("b", 2, 4))
    adv = compute_advantages(batch, epsilon=0.0)
    assert adv.values.tolist() == pytest.approx([0.0, 0.0, -(0.5**0.5), 0.5**0.5], rel=1e-6)
    assert adv.stats.degenerate_groups == 1
    assert np.isnan(adv.rewards[:2]).all() and adv.rewards[2:].tolist() == [2.0, 4.0]


def test_single_ok_rollout_group_is_degenerate() -> None:
    """[3, fail, fail]: one OK episode has no baseline -> all 0, counted as degenerate."""
    adv = compute_advantages(_batch(*_group("r", 3, None, None)))
    assert adv.values.tolist() == [0.0, 0.0, 0.0]
    assert (adv.stats.degenerate_groups, adv.stats.zero_spread_groups) == (1, 0)


@pytest.mark.parametrize("scale", list(Scaling))
@pytest.mark.parametrize("leave_one_out", [False, True])
def test_zero_spread_group_gives_exact_zeros(scale: Scaling, leave_one_out: bool) -> None:
    """[.1, .1, .1] -> all equal: exactly 0 (not rounding noise) under every option."""
    batch = _batch(*_group("r", 0.1, 0.1, 0.1))
    adv = compute_advantages(batch, scale=scale, leave_one_out=leave_one_out)
    assert adv.values.tolist() == [0.0, 0.0, 0.0]
    assert (adv.stats.zero_spread_groups, adv.stats.degenerate_groups) == (1, 0)


def test_group_batch_and_no_scaling() -> None:
    """a [0, 2], b [4, 8]: centered a [-1, 1], b [-2, 2].

    group: a / sqrt2, b / (2 sqrt2)           -> [-.707, .707, -.707, .707]
    batch: all OK [0, 2, 4, 8]: mean 3.5, squares 12.25 + 2.25 + .25 + 20.25 = 35,
           std sqrt(35/3)                      -> [-1, 1, -2, 2] / sqrt(35/3)
    none:  (Dr. GRPO)                          -> [-1, 1, -2, 2]
    """
    batch = _batch(*_group("a", 0, 2), *_group("b", 4, 8))
    half = 0.5**0.5
    assert _values(batch, scale="group") == pytest.approx([-half, half, -half, half], rel=1e-6)
    batch_std = math.sqrt(35 / 3)
    expected = [-1 / batch_std, 1 / batch_std, -2 / batch_std, 2 / batch_std]
    assert _values(batch, scale=Scaling.BATCH) == pytest.approx(expected, rel=1e-6)
    assert _values(batch, scale="none") == pytest.approx([-1.0, 1.0, -2.0, 2.0])


def test_batch_std_ignores_failures_but_counts_degenerate_groups() -> None:
    """a [0, 2], b [6, fail]: batch std over OK [0, 2, 6]: mean 8/3, squares
    64/9 + 4/9 + 100/9 = 168/9, /2 -> std sqrt(28/3); a -> [-1, 1] / sqrt(28/3), b -> [0, 0]."""
    batch = _batch(*_group("a", 0, 2), *_group("b", 6, None))
    std = math.sqrt(28 / 3)
    assert _values(batch, scale="batch") == pytest.approx([-1 / std, 1 / std, 0, 0], rel=1e-6)


def test_leave_one_out_baseline() -> None:
    """[1, 0, 1, 1], S = 3: baseline_i = (S - r_i)/3 = [2/3, 1, 2/3, 2/3].

    none:  r - baseline -> [1/3, -1, 1/3, 1/3]  (= 4/3 of the plain centered [.25, -.75, ...])
    group: / std(ddof=1) .5 -> [2/3, -2, 2/3, 2/3]
    """
    batch = _batch(*_group("r", 1, 0, 1, 1))
    third = 1 / 3
    loo_none = _values(batch, scale="none", leave_one_out=True)
    assert loo_none == pytest.approx([third, -1, third, third], rel=1e-6)
    loo_group = _values(batch, leave_one_out=True)
    assert loo_group == pytest.approx([2 * third, -2, 2 * third, 2 * third], rel=1e-6)


def test_leave_one_out_ignores_failures() -> None:
    """[4, fail, 0]: n = 2, S = 4 -> baselines [0, -, 4] -> none: [4, 0, -4]."""
    assert _values(_batch(*_group("r", 4, None, 0)), scale="none", leave_one_out=True) == [
        4.0,
        0.0,
        -4.0,
    ]


def test_groups_come_from_row_ids_not_prompts() -> None:
    """Rows a and b share their prompt ([5]) but are two groups: a [1, 0] -> [.707, -.707],
    b [1, 1] -> zero spread; interleaved order gives group_index [0, 1, 0, 1]."""
    a0, a1 = _group("a", 1, 0)
    b0, b1 = _group("b", 1, 1)
    adv = compute_advantages(_batch(a0, b0, a1, b1), epsilon=0.0)
    half = 0.5**0.5
    assert adv.values.tolist() == pytest.approx([half, 0, -half, 0], rel=1e-6)
    assert adv.group_index.tolist() == [0, 1, 0, 1]


def test_single_group_batch() -> None:
    """One group [2, 0]: mean 1, std sqrt2 -> [.707, -.707]; one group, nothing degenerate."""
    adv = compute_advantages(_batch(*_group("only", 2, 0)), epsilon=0.0)
    assert adv.values.tolist() == pytest.approx([0.5**0.5, -(0.5**0.5)], rel=1e-6)
    assert (adv.stats.num_groups, adv.stats.degenerate_groups) == (1, 0)


def test_all_failed_batch_gives_zeros_and_full_stats() -> None:
    """Two groups, every rollout failed: all zeros, NaN rewards, counts still filled."""
    rollouts = [
        _rollout("a", status=RolloutStatus.TIMEOUT),
        _rollout("a", repeat=1, status=RolloutStatus.AGENT_ERROR),
        _rollout("b", status=RolloutStatus.TIMEOUT),
    ]
    adv = compute_advantages(_batch(*rollouts), scale="batch")
    assert adv.values.tolist() == [0.0, 0.0, 0.0]
    assert np.isnan(adv.rewards).all()
    stats = adv.stats
    assert (stats.num_rows, stats.num_episodes, stats.num_groups) == (3, 3, 2)
    assert stats.ok_episodes == 0
    assert (stats.degenerate_groups, stats.zero_spread_groups) == (2, 0)


def test_group_advantages_array_level() -> None:
    """Ints as group ids, NaN on a failed entry: group 7 [1, 0, 1, 1] -> [.5, -1.5, .5, .5];
    group 3 [5, x] has one OK entry -> 0."""
    values = group_advantages(
        [1.0, 5.0, 0.0, math.nan, 1.0, 1.0],
        np.array([7, 3, 7, 3, 7, 7]),
        [True, True, True, False, True, True],
        epsilon=0.0,
    )
    assert values.dtype == np.float64 and not values.flags.writeable
    assert values.tolist() == [0.5, 0.0, -1.5, 0.0, 0.5, 0.5]


# --- forks -----------------------------------------------------------------------------


def test_fork_rows_share_their_episodes_advantage() -> None:
    """Episode 0 (reward 1) has a fork; episodes 1 and 2 have reward 0.

    Episodes [1, 0, 0]: mean 1/3, std sqrt(1/3) -> [2/sqrt3, -1/sqrt3, -1/sqrt3]; rows
    [ep0, ep0 fork, ep1, ep2] -> [1.155, 1.155, -.577, -.577]. Counting the fork as an
    episode would give [1, 1, 0, 0] -> ±.866 instead. A fork row that is not OK gets 0.
    """
    fork = _rollout("r", 1.0)
    bad_fork = attrs.evolve(_rollout("r", 1.0), status=RolloutStatus.DRIFT)
    first = _rollout("r", 1.0, forks=(fork, bad_fork))
    batch = _batch(first, *_group("r", 0, 0))
    assert batch.episode_index.tolist() == [0, 0, 0, 1, 2]
    adv = compute_advantages(batch, epsilon=0.0)
    hi, lo = 2 / SQRT3, -1 / SQRT3
    assert adv.values.tolist() == pytest.approx([hi, hi, 0.0, lo, lo], rel=1e-6)
    assert (adv.stats.num_rows, adv.stats.num_episodes, adv.stats.ok_episodes) == (5, 3, 3)
    assert RolloutStats.of(batch, adv).reward_mean == pytest.approx(1 / 3)  # per episode
    assert adv.rewards.tolist()[:2] == [1.0, 1.0] and math.isnan(adv.rewards[2])


# --- several rewards -------------------------------------------------------------------

# (a, b) per rollout; weights a = 1, b = .5  ->  r = a + b/2 = [1, 1, 2, 0]
_PAIRS = [(1.0, 0.0), (0.0, 2.0), (1.0, 2.0), (0.0, 0.0)]
_WEIGHTS = {"a": 1.0, "b": 0.5}


def _component_group(row_id: str, pairs: list[tuple[float, float]]) -> list[Rollout]:
    return [
        _rollout(row_id, a + b, repeat=i, components={"a": a, "b": b})
        for i, (a, b) in enumerate(pairs)
    ]


def test_weighted_sum_then_normalize() -> None:
    """r = a + b/2 = [1, 1, 2, 0]: mean 1, squares [0, 0, 1, 1] / 3 -> std sqrt(2/3)
    -> [0, 0, 1, -1] / sqrt(2/3) = [0, 0, 1.2247, -1.2247]. ``Batch.rewards`` (a + b) unused."""
    adv = compute_advantages(
        _batch(*_component_group("r", _PAIRS)), reward_weights=_WEIGHTS, epsilon=0.0
    )
    s = math.sqrt(2 / 3)
    assert adv.values.tolist() == pytest.approx([0, 0, 1 / s, -1 / s], rel=1e-6)
    assert adv.rewards.tolist() == [1.0, 1.0, 2.0, 0.0]


def test_gdpo_without_batch_norm() -> None:
    """a [1, 0, 1, 0]: mean .5, std sqrt(1/3) -> A_a = sqrt3/2 [1, -1, 1, -1];
    b [0, 2, 2, 0]: mean 1, std sqrt(4/3)    -> A_b = sqrt3/2 [-1, 1, 1, -1];
    A_a + A_b / 2 = sqrt3/4 [1, -1, 3, -3]."""
    adv = compute_advantages(
        _batch(*_component_group("r", _PAIRS)),
        reward_weights=_WEIGHTS,
        aggregation="gdpo",
        gdpo_batch_norm=False,
        epsilon=0.0,
    )
    q = SQRT3 / 4
    assert adv.values.tolist() == pytest.approx([q, -q, 3 * q, -3 * q], rel=1e-6)
    assert adv.rewards.tolist() == [1.0, 1.0, 2.0, 0.0]


def test_gdpo_with_batch_norm_over_groups() -> None:
    """Group r as above: x = sqrt3/4 [1, -1, 3, -3]. Group s, (a, b) = (1, 0), (0, 0):
    a [1, 0] -> mean .5, std sqrt(1/2) -> A_a = ±1/sqrt2; b constant -> A_b = 0;
    x = [1/sqrt2, -1/sqrt2]. Group t [fail, (1, 1)] is degenerate and stays 0.

    x over the 6 OK episodes of r and s: mean 0; squares 3/16 * 20 + 1/2 + 1/2 = 4.75,
    / 5 -> std sqrt(.95); each x / sqrt(.95).
    """
    rollouts = [
        *_component_group("r", _PAIRS),
        *_component_group("s", [(1.0, 0.0), (0.0, 0.0)]),
        _rollout("t", status=RolloutStatus.TIMEOUT),
        _rollout("t", 2.0, repeat=1, components={"a": 1.0, "b": 1.0}),
    ]
    adv = compute_advantages(
        _batch(*rollouts), reward_weights=_WEIGHTS, aggregation=Aggregation.GDPO, epsilon=0.0
    )
    q, h, std = SQRT3 / 4, 0.5**0.5, math.sqrt(0.95)
    expected = [q, -q, 3 * q, -3 * q, h, -h]
    assert adv.values.tolist() == pytest.approx([x / std for x in expected] + [0, 0], rel=1e-6)
    assert adv.stats.degenerate_groups == 1


def test_gdpo_keeps_signal_that_the_sum_collapses() -> None:
    """(a, b) = (1, 0), (0, 2) with weights 1 and .5: r = [1, 1] is zero spread under "sum";
    GDPO: a [1, 0] -> A_a = ±1/sqrt2; b [0, 2] -> mean 1, std sqrt2 -> A_b = ∓1/sqrt2;
    x = A_a + A_b/2 = ±1/(2 sqrt2) = ±.354."""
    batch = _batch(*_component_group("r", [(1.0, 0.0), (0.0, 2.0)]))
    summed = compute_advantages(batch, reward_weights=_WEIGHTS, epsilon=0.0)
    assert summed.values.tolist() == [0.0, 0.0] and summed.stats.zero_spread_groups == 1
    gdpo = compute_advantages(
        batch, reward_weights=_WEIGHTS, aggregation="gdpo", gdpo_batch_norm=False, epsilon=0.0
    )
    assert gdpo.values.tolist() == pytest.approx([0.5**1.5, -(0.5**1.5)], rel=1e-6)
    assert gdpo.stats.zero_spread_groups == 0


def test_gdpo_zero_spread_when_every_component_is_constant() -> None:
    """Group u: (a, b) = (1, 2) twice -> every component constant -> exactly 0, counted once."""
    batch = _batch(*_component_group("u", [(1.0, 2.0), (1.0, 2.0)]))
    adv = compute_advantages(batch, reward_weights=_WEIGHTS, aggregation="gdpo")
    assert adv.values.tolist() == [0.0, 0.0]
    assert adv.stats.zero_spread_groups == 1


def test_gdpo_without_weights_weighs_every_component_by_one() -> None:
    """No reward_weights: A_a + A_b = sqrt3/2 [0, 0, 2, -2] = [0, 0, sqrt3, -sqrt3]."""
    adv = compute_advantages(
        _batch(*_component_group("r", _PAIRS)),
        aggregation="gdpo",
        gdpo_batch_norm=False,
        epsilon=0.0,
    )
    assert adv.values.tolist() == pytest.approx([0, 0, SQRT3, -SQRT3], rel=1e-6, abs=1e-7)


def test_failed_rollout_may_lack_components() -> None:
    """A failure that reports no components is fine: OK a [1, 0] (b 0) -> [.707, -.707, 0]."""
    rollouts = [
        *_component_group("r", [(1.0, 0.0), (0.0, 0.0)]),
        _rollout("r", repeat=2, status=RolloutStatus.TRANSPORT_ERROR),
    ]
    values = _values(_batch(*rollouts), reward_weights={"a": 1.0, "b": 0.0})
    assert values == pytest.approx([0.5**0.5, -(0.5**0.5), 0.0], rel=1e-6)


# --- stats -----------------------------------------------------------------------------


def test_stats_and_metrics() -> None:
    """a [1, 0, fail, 1], b [2, 2] (zero spread), c [5] (degenerate): 7 episodes, 6 OK.

    OK rewards [1, 0, 1, 2, 2, 5]: mean 11/6; population variance
    (1 + 0 + 1 + 4 + 4 + 25)/6 - (11/6)^2 = 35/6 - 121/36 = 89/36 -> std sqrt(89)/6.
    The group counts are the advantage computation's; the step metrics built from them and
    the batch are ``RolloutStats``'s (one place for the names every trainer logs).
    """
    batch = _batch(*_group("a", 1, 0, None, 1), *_group("b", 2, 2), *_group("c", 5))
    advantages = compute_advantages(batch)
    stats = advantages.stats
    assert (stats.num_rows, stats.num_episodes, stats.num_groups) == (7, 7, 3)
    assert (stats.degenerate_groups, stats.zero_spread_groups) == (1, 1)
    assert stats.ok_episodes == 6 and stats.informative_groups == 1
    assert stats.partial_groups == 1  # a lost one episode; c's one episode is OK

    metrics = RolloutStats.of(batch, advantages).as_metrics()
    assert (metrics["ok"], metrics["failures"]) == (6, {"timeout": 1})
    assert metrics["reward_mean"] == pytest.approx(11 / 6)
    assert metrics["reward_std"] == pytest.approx(math.sqrt(89) / 6)
    assert metrics["ok_fraction"] == pytest.approx(6 / 7)
    assert (metrics["groups"], metrics["degenerate_groups"], metrics["zero_spread_groups"]) == (
        3,
        1,
        1,
    )
    assert metrics["partial_groups"] == 1


def test_results_are_read_only_and_the_batch_is_untouched() -> None:
    """Outputs are read-only arrays; every array of the batch keeps its values and flags."""
    batch = _batch(*_component_group("r", _PAIRS), _rollout("r", status=RolloutStatus.EMPTY))
    before = {name: np.array(getattr(batch, name), copy=True) for name in ("rewards", "statuses")}
    components = {k: v.copy() for k, v in batch.reward_components.items()}
    options: list[dict[str, Any]] = [{}, {"reward_weights": _WEIGHTS, "aggregation": "gdpo"}]
    for kwargs in options:
        adv = compute_advantages(batch, **kwargs)
        for array in (adv.values, adv.rewards, adv.group_index):
            assert not array.flags.writeable
        assert adv.values.dtype == np.float32 and adv.rewards.dtype == np.float64
        assert adv.group_index.dtype == np.int64 and len(adv) == len(batch)
    for name, array in before.items():
        assert np.array_equal(getattr(batch, name), array)
    for name, array in components.items():
        assert np.array_equal(batch.reward_components[name], array, equal_nan=True)


# --- errors ----------------------------------------------------------------------------


def test_rows_without_row_id_are_a_config_error() -> None:
    """Groups need stable row ids; the message says who sets them."""
    batch = _batch(_rollout("a", 1.0), _rollout(None, 0.0))
    with pytest.raises(
        ConfigError,
        match=r"1 of 2 batch rows have no row_id \(rows 1\).*AgentClient.*"
        r"parse_agent_response\(response, eos_token_id, row_id=\.\.\., repeat_index=\.\.\.\)",
    ):
        compute_advantages(batch)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"scale": "std"}, r"scale must be one of 'group', 'batch', 'none', got 'std'"),
        ({"aggregation": "mean"}, r"aggregation must be one of 'sum', 'gdpo', got 'mean'"),
        ({"epsilon": -1.0}, r"epsilon must be a finite number >= 0"),
        ({"epsilon": math.nan}, r"epsilon must be a finite number >= 0"),
        ({"reward_weights": {}}, r"reward_weights is empty"),
        ({"reward_weights": {"a": math.inf}}, r"reward_weights must be finite"),
        (
            {"reward_weights": {"a": 1.0, "c": 1.0, "d": 2.0}},
            r"no row of the batch has: \['c', 'd'\]; available components: \['a', 'b'\]",
        ),
    ],
)
def test_bad_arguments_are_config_errors(kwargs: dict[str, Any], message: str) -> None:
    """Unknown options, bad epsilon and weights naming absent components say what to pass."""
    with pytest.raises(ConfigError, match=message):
        compute_advantages(_batch(*_component_group("r", _PAIRS)), **kwargs)


def test_gdpo_without_any_component_is_a_config_error() -> None:
    """GDPO needs components to normalize."""
    with pytest.raises(ConfigError, match="no row of the batch has reward_components"):
        compute_advantages(_batch(*_group("r", 1, 0)), aggregation="gdpo")


def test_ok_row_lacking_a_weighted_component_is_a_data_error() -> None:
    """Row 1 (row_id 'r') is OK but has no 'b': the message names the row and the term."""
    rollouts = [
        _rollout("r", 1.0, components={"a": 1.0, "b": 0.0}),
        _rollout("r", 1.0, repeat=1, components={"a": 0.0}),
    ]
    for aggregation in ("sum", "gdpo"):
        with pytest.raises(DataError, match=r"batch row 1 \(row_id 'r'\) is OK but lacks.*'b'"):
            compute_advantages(_batch(*rollouts), reward_weights=_WEIGHTS, aggregation=aggregation)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_reward_on_an_ok_row_is_a_data_error(bad: float) -> None:
    """A NaN or infinite reward on an OK row (fork rows included) cannot be scored."""
    with pytest.raises(DataError, match=r"batch row 1 \(row_id 'r'\) is OK but its reward"):
        compute_advantages(_batch(_rollout("r", 1.0), _rollout("r", bad, repeat=1)))
    with pytest.raises(DataError, match=r"at index 1 \(group 'r'\) is not finite"):
        group_advantages([1.0, bad], ["r", "r"], [True, True])
    forked = _batch(_rollout("r", 1.0, forks=(_rollout("r", bad),)), _rollout("r", 0.0))
    with pytest.raises(DataError, match=r"batch row 1 \(row_id 'r'\) is OK but its reward"):
        compute_advantages(forked)  # an OK fork row is checked too


def test_episode_split_across_row_ids_is_a_data_error() -> None:
    """Samples of one episode (same episode_index) must share the row id."""
    batch = _batch(_rollout("r", 1.0, forks=(_rollout("r", 1.0),)), _rollout("r", 0.0))
    broken = attrs.evolve(batch, row_ids=("r", "other", "r"))
    with pytest.raises(DataError, match="forks must keep their episode's row_id"):
        compute_advantages(broken)


def test_group_advantages_rejects_mismatched_lengths() -> None:
    """rewards, groups and ok need one entry per episode."""
    with pytest.raises(ConfigError, match="got lengths 2, 3 and 2"):
        group_advantages([1.0, 0.0], ["a", "a", "a"], [True, True])
    with pytest.raises(ConfigError, match="must be 1-D"):
        group_advantages([[1.0, 0.0]], ["a"], [True])
    with pytest.raises(ConfigError, match="scale must be one of"):
        group_advantages([1.0, 0.0], ["a", "a"], [True, True], scale="max")


# --- the documented path from a hand-parsed result -----------------------------------------


def _run_result(reward: float, generation: list[int]) -> dict[str, Any]:
    """A one-turn ``/run`` result: prompt [5 6], the generation, its reward."""
    item = {
        "type": "message",
        "role": "assistant",
        "content": [{"type": "output_text", "text": "x"}],
        "prompt_token_ids": [5, 6],
        "generation_token_ids": generation,
        "generation_log_probs": [-0.5] * len(generation),
    }
    return {"response": {"output": [item]}, "reward": reward}


def test_docs_hand_parsed_path_to_advantages() -> None:
    """docs/training.md's block "From a hand-parsed result to advantages", run as written.

    Row a plays [1, 0, agent error] (raw JSON bytes for one of them), row b [2, 4]:
    a's OK rewards [1, 0] -> ±.707, its failure 0; b [2, 4] -> ∓.707.
    """
    page = (Path(__file__).resolve().parents[1] / "docs" / "training.md").read_text()
    section = page.split("### From a hand-parsed result to advantages", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    results = [
        ("data.jsonl:1", 0, _run_result(1.0, [7, 8])),
        ("data.jsonl:1", 1, json.dumps(_run_result(0.0, [9])).encode()),
        ("data.jsonl:1", 2, {"error": "the agent crashed"}),
        ("data.jsonl:2", 0, _run_result(2.0, [7])),
        ("data.jsonl:2", 1, _run_result(4.0, [8])),
    ]
    namespace: dict[str, Any] = {"results": results, "eos_token_id": 2, "pad_token_id": 0}
    exec(compile(code, "docs/training.md", "exec"), namespace)
    advantages = namespace["advantages"]
    half = 0.5**0.5
    assert advantages.values.tolist() == pytest.approx([half, -half, 0, -half, half], rel=1e-5)
    assert namespace["batch"].row_ids == ("data.jsonl:1",) * 3 + ("data.jsonl:2",) * 2
    assert (advantages.stats.num_episodes, advantages.stats.ok_episodes) == (5, 4)


def test_loss_vocabulary_is_one_torch_free_enum() -> None:
    """``LossType`` and ``PolicyLoss`` load without torch; plain strings become members and an
    unknown name is a ConfigError listing the four."""
    code = (
        "import sys; from nemogym_sdk.grpo import ImportanceSampling, LossType, PolicyLoss; "
        "loss = PolicyLoss(loss_type='gspo', importance_sampling='mask'); "
        "print(loss.loss_type is LossType.GSPO, loss.importance_sampling is "
        "ImportanceSampling.MASK, 'torch' in sys.modules, ','.join(LossType))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["True", "True", "False", "grpo,dapo,dr_grpo,gspo"]
    with pytest.raises(ConfigError, match=r"loss_type must be one of 'grpo', 'dapo'.*got 'ppo'"):
        PolicyLoss(loss_type="ppo")
    assert PolicyLoss(loss_type=LossType.DR_GRPO).loss_type == "dr_grpo"
