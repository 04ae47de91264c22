"""Several reward components: the weights, the per-episode components, and GDPO (rule 6)."""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from nemogym_sdk.errors import ConfigError, DataError
from nemogym_sdk.grpo.gather import Gather, everyone
from nemogym_sdk.grpo.normalize import normalize, sample_std
from nemogym_sdk.grpo.results import Aggregation, BoolArray, FloatArray, IntArray, Scaling
from nemogym_sdk.records import Batch

__all__: list[str] = []


def requested_weights(
    batch: Batch,
    reward_weights: Mapping[str, float] | None,
    aggregation: Aggregation,
    shared: bool,
) -> dict[str, float] | None:
    """``{component: weight}`` to use (None: ``Batch.rewards``); ``shared`` when the batch is
    one rank's shard of a batch whose statistics are gathered."""
    if reward_weights is None:
        if aggregation is Aggregation.SUM:
            return None
        if shared:
            raise ConfigError(
                "aggregation='gdpo' across ranks needs reward_weights naming the components "
                "(each rank sees only the components its own shard reports)"
            )
        available = sorted(batch.reward_components)
        if not available:
            raise ConfigError(
                "aggregation='gdpo' normalizes each reward component separately, but no "
                "row of the batch has reward_components; use aggregation='sum' or an "
                "environment that reports reward_components"
            )
        return dict.fromkeys(available, 1.0)
    if not reward_weights:
        raise ConfigError(
            f"reward_weights is empty; name at least one component (available: "
            f"{sorted(batch.reward_components)}) or pass None to use Batch.rewards"
        )
    weights = {str(name): float(weight) for name, weight in reward_weights.items()}
    bad = {name: weight for name, weight in weights.items() if not math.isfinite(weight)}
    if bad:
        raise ConfigError(f"reward_weights must be finite numbers, got {bad}")
    return weights


def present(batch: Batch, weights: Mapping[str, float] | None) -> BoolArray:
    """``[K]`` whether some row of the batch reports each weighted component."""
    names = weights or {}
    return np.array([name in batch.reward_components for name in names], dtype=np.bool_)


def check_present(batch: Batch, weights: Mapping[str, float] | None, found: BoolArray) -> None:
    """A ConfigError when a weight names a component that no row (of any rank) has."""
    unknown = sorted(name for name, seen in zip(weights or {}, found, strict=True) if not seen)
    if unknown:
        raise ConfigError(
            f"reward_weights names components that no row of the batch has: {unknown}; "
            f"available components: {sorted(batch.reward_components)}"
        )


def component_rewards(
    batch: Batch,
    weights: Mapping[str, float],
    first_E: IntArray,
    ok_B: BoolArray,
    row_ids: tuple[str, ...],
) -> dict[str, FloatArray]:
    """``{name: [E]}`` component rewards of each episode (NaN where the episode is not OK),
    checked on every OK row."""
    ok_E = ok_B[first_E]
    components: dict[str, FloatArray] = {}
    missing_B = np.full(len(batch), np.nan)
    for name in weights:
        values_B = np.asarray(batch.reward_components.get(name, missing_B), dtype=np.float64)
        bad_B = ok_B & ~np.isfinite(values_B)
        if bad_B.any():
            b = int(np.flatnonzero(bad_B)[0])
            what = "lacks" if np.isnan(values_B[b]) else "has a non-finite value for"
            raise DataError(
                f"batch row {b} (row_id {row_ids[b]!r}) is OK but {what} the reward component "
                f"{name!r} that reward_weights weighs; every OK rollout must report every "
                f"weighted component (drop {name!r} from reward_weights, or mark the rollout "
                f"not OK)"
            )
        components[name] = np.where(ok_E, values_B[first_E], np.nan)
    return components


def gdpo(
    components: Mapping[str, FloatArray],
    weights: Mapping[str, float],
    group_E: IntArray,
    ok_E: BoolArray,
    num_groups: int,
    scale: Scaling,
    leave_one_out: bool,
    epsilon: float,
    batch_norm: bool,
    gather: Gather | None,
) -> tuple[FloatArray, IntArray, BoolArray]:
    """GDPO over ``E`` episodes: ``([E] advantages, [G] OK counts, [G] zero spread)``.

    The batch normalisation runs over the OK episodes of groups with at least two OK
    episodes (of every rank, with ``gather``); an episode of a degenerate group stays 0 and
    takes no part in it (TRL counts it as a 0 there: rule 6 of ``nemogym_sdk.grpo``).
    """
    E = group_E.shape[0]
    summed_E = np.zeros(E, dtype=np.float64)
    ok_count_G = np.bincount(group_E[ok_E], minlength=num_groups).astype(np.int64)
    zero_spread_G = ok_count_G >= 2  # narrowed below: constant in every weighted component
    for name, weight in weights.items():
        normalized = normalize(
            components[name], group_E, ok_E, num_groups, scale, leave_one_out, epsilon, gather
        )
        summed_E += weight * normalized.advantages
        if weight != 0.0:
            zero_spread_G &= normalized.zero_spread
    active_G = (ok_count_G >= 2) & ~zero_spread_G
    if batch_norm:
        members_E = ok_E & (ok_count_G >= 2)[group_E]
        x_M = np.sort(everyone(gather, summed_E[members_E]))
        if x_M.size >= 2:
            mean, std = float(x_M.mean()), sample_std(x_M)
            denominator = std + epsilon
            if denominator > 0.0:
                summed_E = np.where(members_E, (summed_E - mean) / denominator, 0.0)
    advantage_E = np.where(ok_E & active_G[group_E], summed_E, 0.0)
    return advantage_E, ok_count_G, zero_spread_G
