"""The GRPO conventions of ``docs/training.md``'s table, one test per row (numpy rows here,
torch rows in ``tests/adapters/test_torch_conventions.py``).

TRL's side is transcribed from TRL 1.16's source, not guessed: ``trl_*`` below follow
``GRPOTrainer._generate_and_score_completions`` (``trl/trainer/grpo_trainer.py``, the
``sum_then_normalize`` and ``normalize_then_sum`` branches) and ``trl.trainer.utils.nanstd``
line by line, in numpy: rewards come in groups of ``num_generations`` consecutive rows, a
NaN reward is an unscorable completion, and ``1e-4`` is TRL's hard-coded epsilon.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import attrs
import numpy as np
import pytest

from nemogym_sdk import ConfigError, DataError, Rollout, RolloutStats, RolloutStatus, collate
from nemogym_sdk.grpo import compute_advantages
from nemogym_sdk.testing import scored_rollout

from .thread_ranks import run_ranks

TRL_EPS = 1e-4
FloatArray = np.ndarray[Any, np.dtype[np.float64]]


def trl_nanstd(x: FloatArray, axis: int | None = None, keepdims: bool = False) -> FloatArray:
    """``trl.trainer.utils.nanstd``: NaN-aware, Bessel-corrected; NaN below two values."""
    with warnings.catch_warnings(), np.errstate(invalid="ignore", divide="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)
        mean = np.nanmean(x, axis=axis, keepdims=True)
        variance = np.nanmean((x - mean) ** 2, axis=axis, keepdims=True)
        count = np.sum(~np.isnan(x), axis=axis, keepdims=True)
        variance = variance * np.where(count > 1, count / (count - 1), np.nan)
    std = np.sqrt(variance)
    if keepdims:
        return std
    return std.reshape(()) if axis is None else np.squeeze(std, axis=axis)


def trl_nanmean(x: FloatArray, **kwargs: Any) -> FloatArray:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.asarray(np.nanmean(x, **kwargs))


def trl_sum_then_normalize(
    components_NK: FloatArray, weights_K: FloatArray, num_generations: int, scale: str = "group"
) -> FloatArray:
    """TRL's ``sum_then_normalize`` branch: weighted ``nansum``, group mean, then the std."""
    G = num_generations
    rewards = np.nansum(components_NK * weights_K[None, :], axis=1)
    rewards[np.isnan(components_NK).all(axis=1)] = np.nan
    mean = np.repeat(trl_nanmean(rewards.reshape(-1, G), axis=1), G)
    if scale in ("group", "none"):
        std = np.repeat(trl_nanstd(rewards.reshape(-1, G), axis=1), G)
    else:
        std = np.full_like(rewards, trl_nanstd(rewards))
    advantages = rewards - mean
    if scale != "none":
        advantages = advantages / (std + TRL_EPS)
    return np.nan_to_num(advantages, nan=0.0)


def trl_normalize_then_sum(
    components_NK: FloatArray, weights_K: FloatArray, num_generations: int
) -> FloatArray:
    """TRL's ``normalize_then_sum`` branch (GDPO): per-component group normalisation, a
    weighted ``nansum``, then one batch normalisation."""
    K = components_NK.shape[1]
    grouped = components_NK.reshape(-1, num_generations, K)
    mean_k = trl_nanmean(grouped, axis=1, keepdims=True)
    std_k = trl_nanstd(grouped, axis=1, keepdims=True)
    reward_k = ((grouped - mean_k) / (std_k + TRL_EPS)).reshape(-1, K)
    rewards = np.nansum(reward_k * weights_K[None, :], axis=1)
    rewards[np.isnan(components_NK).all(axis=1)] = np.nan
    advantages = (rewards - trl_nanmean(rewards)) / (trl_nanstd(rewards) + TRL_EPS)
    return np.nan_to_num(advantages, nan=0.0)


def _rollouts(row_id: str, rewards: list[float | None]) -> list[Rollout]:
    """One group; None is a TIMEOUT failure (TRL: an unscorable completion, NaN)."""
    return [
        scored_rollout(row_id, 0.0 if r is None else r, repeat_index=i)
        if r is not None
        else scored_rollout(row_id, 0.0, repeat_index=i, status=RolloutStatus.TIMEOUT)
        for i, r in enumerate(rewards)
    ]


def _as_trl(groups: list[list[float | None]]) -> FloatArray:
    """``[N, 1]`` TRL rewards of the groups (NaN for failures)."""
    return np.array([[math.nan if r is None else r] for g in groups for r in g])


def _with_components(row_id: str, pairs: list[tuple[float, float] | None]) -> list[Rollout]:
    """One group with components a and b; None is a TIMEOUT failure."""
    out = []
    for i, pair in enumerate(pairs):
        if pair is None:
            out.append(scored_rollout(row_id, 0.0, repeat_index=i, status=RolloutStatus.TIMEOUT))
        else:
            rollout = scored_rollout(row_id, pair[0] + pair[1], repeat_index=i)
            out.append(attrs.evolve(rollout, reward_components={"a": pair[0], "b": pair[1]}))
    return out


def _components_as_trl(groups: list[list[tuple[float, float] | None]]) -> FloatArray:
    return np.array([[math.nan, math.nan] if p is None else list(p) for g in groups for p in g])


ONE = np.array([1.0])
WEIGHTS = {"a": 1.0, "b": 0.5}
WEIGHTS_K = np.array([1.0, 0.5])


def test_convention_advantage_epsilon() -> None:
    """TRL divides by ``std + 1e-4``; we by ``std + 1e-6`` unless told ``epsilon=1e-4``.

    Group [0, 1e-6]: std(ddof=1) = 7.07e-7, so the epsilon dominates: our default gives
    ±5e-7 / (7.07e-7 + 1e-6) = ±0.293, TRL's ±5e-7 / (7.07e-7 + 1e-4) = ±0.00496.
    """
    groups: list[list[float | None]] = [[0.0, 1e-6], [1.0, 0.0, 1.0, 1.0]]
    for group in groups:
        batch = collate(_rollouts("r", group), pad_token_id=0)
        trl = trl_sum_then_normalize(_as_trl([group]), ONE, len(group))
        ours = compute_advantages(batch).values
        std = float(np.std(group, ddof=1))
        centered = np.array(group) - np.mean(group)
        assert ours.tolist() == pytest.approx((centered / (std + 1e-6)).tolist(), rel=1e-5)
        matched = compute_advantages(batch, epsilon=TRL_EPS).values
        assert matched.tolist() == pytest.approx(trl.tolist(), rel=1e-5)
    tiny = collate(_rollouts("r", [0.0, 1e-6]), pad_token_id=0)
    assert float(compute_advantages(tiny).values[1]) == pytest.approx(0.2929, rel=1e-3)


def test_convention_bessel_correction() -> None:
    """Both scale by the sample std (``ddof=1``): [1, 0, 1, 1] -> std 0.5, in group and batch
    scaling alike. The logged spread differs: our ``AdvantageStats.reward_std`` describes
    the batch (``ddof=0``, 0.433), TRL's ``reward_std`` metric uses ``ddof=1`` (0.5)."""
    groups: list[list[float | None]] = [[1.0, 0.0, 1.0, 1.0], [2.0, 0.0, 0.0, 0.0]]
    batch = collate([*_rollouts("a", groups[0]), *_rollouts("b", groups[1])], pad_token_id=0)
    for scale in ("group", "batch"):
        ours = compute_advantages(batch, scale=scale, epsilon=TRL_EPS).values
        trl = trl_sum_then_normalize(_as_trl(groups), ONE, 4, scale=scale)
        assert ours.tolist() == pytest.approx(trl.tolist(), rel=1e-5)
    single = collate(_rollouts("a", groups[0]), pad_token_id=0)
    stats = RolloutStats.of(single)  # the logged reward_std describes the batch: ddof=0
    assert stats.reward_std == pytest.approx(np.std(groups[0], ddof=0))
    assert float(trl_nanstd(_as_trl(groups[:1]).ravel())) == pytest.approx(0.5)


def test_convention_groups_by_row_id() -> None:
    """TRL's groups are ``num_generations`` consecutive rows; ours share a row id, in any
    order. Interleaved a0 b0 a1 b1 (a [1, 0], b [0, 2]) gives ours the advantages TRL gives
    the grouped order a0 a1 b0 b1; TRL on the interleaved order would mix the rows."""
    a, b = _rollouts("a", [1.0, 0.0]), _rollouts("b", [0.0, 2.0])
    ours = compute_advantages(collate([a[0], b[0], a[1], b[1]], pad_token_id=0), epsilon=TRL_EPS)
    grouped = trl_sum_then_normalize(_as_trl([[1.0, 0.0], [0.0, 2.0]]), ONE, 2)
    assert ours.values.tolist() == pytest.approx(grouped[[0, 2, 1, 3]].tolist(), rel=1e-5)
    mixed = trl_sum_then_normalize(_as_trl([[1.0, 0.0], [0.0, 2.0]])[[0, 2, 1, 3]], ONE, 2)
    assert not np.allclose(mixed, ours.values)


def test_convention_failed_rows_leave_the_baseline() -> None:
    """Same as TRL: a failed (unscorable) rollout leaves its group's mean and std and gets
    advantage 0; a group with one valid rollout gets 0 (TRL: NaN std -> 0). Groups
    [1, 0, fail, 1], [2, fail, 4, 4] and [3, fail, fail, fail], every scale."""
    groups: list[list[float | None]] = [
        [1.0, 0.0, None, 1.0],
        [2.0, None, 4.0, 4.0],
        [3.0, None, None, None],
    ]
    batch = collate(
        [r for i, g in enumerate(groups) for r in _rollouts(f"g{i}", g)], pad_token_id=0
    )
    for scale in ("group", "batch", "none"):
        ours = compute_advantages(batch, scale=scale, epsilon=TRL_EPS).values
        trl = trl_sum_then_normalize(_as_trl(groups), ONE, 4, scale=scale)
        assert ours.tolist() == pytest.approx(trl.tolist(), rel=1e-5, abs=1e-7)
        assert ours[[2, 5, 9, 10, 11]].tolist() == [0.0] * 5


def test_convention_partially_scored_rows() -> None:
    """An OK rollout lacking a weighted component: TRL's ``nansum`` scores the missing term
    as 0 silently; ours is a DataError naming the row and the component."""
    rollouts = [
        *_with_components("r", [(1.0, 0.0), (0.0, 1.0)]),
        attrs.evolve(scored_rollout("r", 1.0, repeat_index=2), reward_components={"a": 1.0}),
    ]
    trl = trl_sum_then_normalize(np.array([[1.0, 0.0], [0.0, 1.0], [1.0, math.nan]]), WEIGHTS_K, 3)
    assert np.isfinite(trl).all() and trl[2] > 0  # scored as a + 0.5 * 0
    with pytest.raises(DataError, match=r"batch row 2 \(row_id 'r'\) is OK but lacks.*'b'"):
        compute_advantages(collate(rollouts, pad_token_id=0), reward_weights=WEIGHTS)


def test_convention_gdpo_single_ok_rollout() -> None:
    """GDPO equals TRL's ``normalize_then_sum`` except on a group with one OK rollout.

    r and s are full groups of 3; t has one OK rollout and two failures. Without t, ours
    and TRL's agree. With t, ours leaves t's rollout at 0 and out of the batch statistics,
    so r and s keep their advantages bit for bit. TRL scores t's rollout a 0 (NaN group
    std, then ``nansum``) and counts it in the batch std: 6 sums x (mean 0) and one 0 give
    std^2 = sum x^2 / 6 instead of / 5, so TRL's r and s advantages are ours * sqrt(6/5),
    and t's is (0 - mean) / std, 0 up to rounding.
    """
    groups: list[list[tuple[float, float] | None]] = [
        [(1.0, 0.0), (0.0, 1.0), (1.0, 1.0)],
        [(0.0, 0.0), (1.0, 0.0), (0.0, 1.0)],
        [(1.0, 1.0), None, None],
    ]
    rollouts = [r for i, g in enumerate(groups) for r in _with_components(f"g{i}", g)]
    options: dict[str, Any] = {"reward_weights": WEIGHTS, "aggregation": "gdpo", "epsilon": TRL_EPS}
    without_t = compute_advantages(collate(rollouts[:6], pad_token_id=0), **options).values
    trl_without_t = trl_normalize_then_sum(_components_as_trl(groups[:2]), WEIGHTS_K, 3)
    assert without_t.tolist() == pytest.approx(trl_without_t.tolist(), rel=1e-5)

    ours = compute_advantages(collate(rollouts, pad_token_id=0), **options).values
    assert ours[:6].tolist() == without_t.tolist()
    assert ours[6:].tolist() == [0.0, 0.0, 0.0]
    trl = trl_normalize_then_sum(_components_as_trl(groups), WEIGHTS_K, 3)
    assert abs(trl[6]) < 1e-6 and trl[7:].tolist() == [0.0, 0.0]
    assert trl[:6].tolist() == pytest.approx((ours[:6] * math.sqrt(6 / 5)).tolist(), rel=1e-3)
    assert not np.allclose(trl[:6], ours[:6], rtol=1e-2)


def test_convention_gdpo_components_follow_scale() -> None:
    """TRL's ``normalize_then_sum`` always divides each component by its group std
    (``scale_rewards`` is not read there); ours applies ``scale`` to each component, so
    ``scale="group"`` (the default) is TRL's and ``scale="none"`` only centers them.
    Group [(1, 0), (0, 2)]: centered a [.5, -.5], b [-1, 1] -> a + b/2 = [0, 0]."""
    groups: list[list[tuple[float, float] | None]] = [
        [(1.0, 0.0), (0.0, 2.0)],
        [(1.0, 0.0), (0.0, 0.0)],
    ]
    batch = collate(
        [r for i, g in enumerate(groups) for r in _with_components(f"g{i}", g)], pad_token_id=0
    )
    options: dict[str, Any] = {"reward_weights": WEIGHTS, "aggregation": "gdpo", "epsilon": TRL_EPS}
    trl = trl_normalize_then_sum(_components_as_trl(groups), WEIGHTS_K, 2)
    assert compute_advantages(batch, **options).values.tolist() == pytest.approx(
        trl.tolist(), rel=1e-5
    )
    centered = compute_advantages(batch, scale="none", gdpo_batch_norm=False, **options).values
    assert centered.tolist() == [0.0, 0.0, 0.5, -0.5]


def _shards() -> tuple[list[Rollout], list[Rollout]]:
    """Two ranks' shards of whole groups, with failures; the second shard's groups are
    more spread out, so per-rank batch statistics would differ from the batch's."""
    first = [
        *_with_components("a", [(1.0, 0.0), (0.0, 1.0), None, (1.0, 1.0)]),
        *_with_components("b", [(0.0, 0.0), (1.0, 0.0)]),
    ]
    second = [
        *_with_components("c", [(4.0, 0.0), (0.0, 3.0), (2.0, 2.0)]),
        *_with_components("d", [(5.0, 1.0), None, (0.0, 0.0)]),
    ]
    return first, second


BATCH_OPTIONS: list[dict[str, Any]] = [
    {"scale": "batch"},
    {"scale": "batch", "leave_one_out": True, "reward_weights": WEIGHTS},
    {"aggregation": "gdpo", "reward_weights": WEIGHTS},
    {"aggregation": "gdpo", "reward_weights": WEIGHTS, "scale": "batch"},
]


@pytest.mark.parametrize("options", BATCH_OPTIONS)
def test_convention_batch_statistics_span_every_rank(options: dict[str, Any]) -> None:
    """TRL gathers every process's rewards before normalising; with ``gather`` our batch
    statistics span every rank too: two ranks (threads) on their shards give, bit for bit,
    one process's advantages on the concatenated batch. Without it each shard's own
    statistics would differ. (The torch.distributed version, with the refusal when no
    hook is given, is ``tests/adapters/test_torch_distributed.py``.)"""
    first, second = _shards()
    shards = [collate(first, pad_token_id=0), collate(second, pad_token_id=0)]
    results = run_ranks(
        [lambda g, s=s: compute_advantages(s, gather=g, **options).values for s in shards]
    )
    whole = compute_advantages(collate(first + second, pad_token_id=0), **options).values
    assert np.array_equal(np.concatenate(results), whole)
    alone = np.concatenate([compute_advantages(s, **options).values for s in shards])
    assert not np.allclose(alone, whole)
    same = compute_advantages(
        collate(first + second, pad_token_id=0), gather=lambda v: v, **options
    )
    assert np.array_equal(same.values, whole)


def test_gather_keeps_ranks_in_step_when_one_fails() -> None:
    """A rank whose data fails its checks does not leave the other waiting: both raise.
    A rank whose shard holds no OK rollout still takes part; GDPO across ranks needs the
    components named."""
    first, second = _shards()
    bad = [*second[:-1], attrs.evolve(second[-1], reward=math.nan)]
    shards = [collate(first, pad_token_id=0), collate(bad, pad_token_id=0)]
    mine, theirs = run_ranks(
        [lambda g, s=s: compute_advantages(s, scale="batch", gather=g) for s in shards]
    )
    assert isinstance(theirs, DataError) and "is not finite" in str(theirs)
    assert isinstance(mine, DataError) and "another rank" in str(mine)

    failed = [scored_rollout("e", 0.0, repeat_index=i, status=RolloutStatus.EMPTY) for i in (0, 1)]
    shards = [collate(first, pad_token_id=0), collate(failed, pad_token_id=0)]
    results = run_ranks(
        [lambda g, s=s: compute_advantages(s, scale="batch", gather=g).values for s in shards]
    )
    whole = compute_advantages(collate(first + failed, pad_token_id=0), scale="batch").values
    assert np.array_equal(np.concatenate(results), whole)

    with pytest.raises(ConfigError, match="needs reward_weights"):
        compute_advantages(shards[0], aggregation="gdpo", gather=lambda v: v)
