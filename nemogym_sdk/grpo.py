"""Group-relative advantages for GRPO, failure-aware (numpy only; losses live in adapters).

GRPO plays every dataset row ``num_generations`` times and scores each rollout against
the other rollouts of the same row. Here a *group* is the set of rollouts that share
``Batch.row_ids`` (the stable row id that ``AgentClient`` stamps on every rollout),
never rows that merely share prompt text: two dataset rows with the same prompt are two
groups. Group numbers (``Advantages.group_index``) follow the order in which row ids
first appear in the batch.

Episodes, not rows. A ``Batch`` row may be one of several samples of one episode (a
rollout and its ``forks`` share ``Batch.episode_index``). Statistics run over
*episodes*: an episode's status and reward are read from its first row, and every row
of the episode then gets the episode's advantage (times 0 when that row itself is not
``OK``). A fork therefore never counts twice in a baseline.

The rules, for the ``OK`` episodes ``r_1 .. r_n`` of one group, ``S = r_1 + .. + r_n``:

1. Failures leave the group. Episodes whose status is not ``OK`` are left out of the
   group's mean and standard deviation and get advantage 0. Their reward (the seed's
   placeholder, usually 0.0) is never read, so a failure never moves another rollout's
   advantage: an infrastructure error is not a reward of 0.
2. Degenerate groups. A group with fewer than two ``OK`` episodes has no baseline; all
   its advantages are 0 and it is counted in ``AdvantageStats.degenerate_groups``.
3. Baseline. ``mean = S / n``. With ``leave_one_out=True`` (RLOO, NeMo RL's
   ``use_leave_one_out_baseline``) episode ``i`` is compared with the mean of the
   *other* episodes, ``(S - r_i) / (n - 1)``; this equals ``n / (n - 1)`` times the
   plain centered reward.
4. Scaling, after centering (TRL's ``scale_rewards``): ``group`` divides by the group's
   standard deviation, ``batch`` by the standard deviation of every ``OK`` episode
   reward of the batch (degenerate groups included), ``none`` does not divide (Dr.
   GRPO). Standard deviations are *sample* deviations (``ddof=1``), as in TRL and NeMo
   RL, and ``epsilon`` is added to the denominator: ``(r_i - baseline_i) / (std + eps)``.
   With ``leave_one_out`` the scale is still the std of all ``n`` rewards.
5. Zero spread. A group with at least two ``OK`` episodes whose rewards are all equal
   teaches nothing: its advantages are exactly 0 (not merely rounding noise) and it is
   counted in ``AdvantageStats.zero_spread_groups``.
6. Multiple rewards. With ``reward_weights`` the per-term ``Batch.reward_components``
   are used instead of ``Batch.rewards``:

   - ``aggregation="sum"`` (TRL's ``sum_then_normalize``): ``r = sum_k w_k * c_k``, then
     rules 1-5 on ``r``.
   - ``aggregation="gdpo"`` (GDPO, NVIDIA's group reward-decoupled normalization, TRL's
     ``normalize_then_sum``): rules 1-5 on each component separately, then the weighted
     sum ``x = sum_k w_k * A_k``; with ``gdpo_batch_norm`` that sum is standardized over
     the ``OK`` episodes of the non-degenerate groups, ``(x - mean) / (std + eps)``
     (``ddof=1``). Every group's component advantages sum to 0, so ``mean`` is 0 up to
     rounding; rows of degenerate groups stay 0. A group is "zero spread" when every
     weighted component is constant over its ``OK`` episodes; its advantages are 0.
     Without ``reward_weights``, ``gdpo`` weighs every component of the batch by 1.0.

   The scalar reward reported in ``Advantages.rewards`` and the reward statistics is
   ``sum_k w_k * c_k`` in both modes.

The result does not depend on the order of the rollouts: sums run over each group's
rewards sorted by value, so advantages are bit-for-bit reproducible whatever order the
rollouts completed in, and adding, removing or changing failed rollouts leaves every
other advantage bit-for-bit unchanged.

Errors: a bad argument (unknown ``scale`` or ``aggregation``, a weight naming a
component no row has, a row without a row id) is a ``ConfigError``; bad data (a
non-finite reward on an ``OK`` row, an ``OK`` row lacking a weighted component, samples of
one episode with different row ids) is a ``DataError``.
Neither function mutates its inputs.

Example, one group of four rollouts of which one failed::

    rewards [1, 0, 1, x]   ok [T, T, T, F]
    OK rewards [1, 0, 1]: mean 2/3, std(ddof=1) 0.577
    advantages [0.577, -1.155, 0.577, 0]   (x never matters)
"""

from __future__ import annotations

import enum
import logging
import math
from collections import Counter
from collections.abc import Hashable, Mapping, Sequence
from typing import Any, TypeVar

import attrs
import numpy as np
import numpy.typing as npt

from nemogym_sdk.errors import ConfigError, DataError
from nemogym_sdk.records import Batch, RolloutStatus, readonly_array

__all__ = [
    "AdvantageStats",
    "Advantages",
    "Aggregation",
    "Scaling",
    "compute_advantages",
    "group_advantages",
]

logger = logging.getLogger(__name__)

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]


class Scaling(enum.StrEnum):
    """What the centered rewards are divided by (TRL's ``scale_rewards``)."""

    GROUP = "group"
    """The group's standard deviation of ``OK`` rewards (``ddof=1``): standard GRPO."""
    BATCH = "batch"
    """The standard deviation of every ``OK`` episode reward of the batch (``ddof=1``)."""
    NONE = "none"
    """No division: centered rewards only (Dr. GRPO)."""


class Aggregation(enum.StrEnum):
    """How several reward components become one advantage."""

    SUM = "sum"
    """Weighted sum of the raw components, then group normalization (sum, then normalize)."""
    GDPO = "gdpo"
    """Group-normalize each component, then take the weighted sum (GDPO)."""


def _float32(value: Any) -> npt.NDArray[np.float32]:
    return readonly_array(value, np.float32)


def _float64(value: Any) -> FloatArray:
    return readonly_array(value, np.float64)


def _int64(value: Any) -> IntArray:
    return readonly_array(value, np.int64)


def _counts(value: Mapping[str, int]) -> dict[str, int]:
    return {str(k): int(v) for k, v in value.items()}


@attrs.frozen(kw_only=True)
class AdvantageStats:
    """What one call to ``compute_advantages`` saw: counts for a trainer's logger."""

    num_rows: int
    """Rows of the batch (samples, forks included)."""
    num_episodes: int
    """Episodes of the batch (distinct ``episode_index`` values)."""
    num_groups: int
    """Groups (distinct row ids)."""
    status_counts: Mapping[str, int] = attrs.field(converter=_counts)
    """Episodes per ``RolloutStatus`` value; statuses with no episode are omitted."""
    degenerate_groups: int
    """Groups with fewer than two ``OK`` episodes: all their advantages are 0."""
    zero_spread_groups: int
    """Groups with at least two ``OK`` episodes whose rewards are all equal (under
    ``gdpo``: whose every weighted component is constant): all their advantages are 0."""
    reward_mean: float
    """Mean scalar reward over ``OK`` episodes; NaN when there are none."""
    reward_std: float
    """Population standard deviation (``ddof=0``) of the same rewards; NaN when there are
    none. (Scaling uses ``ddof=1``; this is a description of the batch, not a scale.)"""

    @property
    def ok_episodes(self) -> int:
        """Episodes whose status is ``OK``."""
        return self.status_counts.get(RolloutStatus.OK.value, 0)

    @property
    def informative_groups(self) -> int:
        """Groups that produce non-zero advantages: neither degenerate nor zero spread."""
        return self.num_groups - self.degenerate_groups - self.zero_spread_groups

    def as_metrics(self, prefix: str = "") -> dict[str, float]:
        """A flat ``{name: value}`` dict for a logger; ``prefix`` is prepended as is.

        Keys: ``rollouts/rows``, ``rollouts/episodes``, ``rollouts/<status>`` for every
        ``RolloutStatus`` (0.0 when absent, so the keys are stable from step to step),
        ``rollouts/ok_fraction``, ``groups/count``, ``groups/degenerate``,
        ``groups/zero_spread``, ``groups/informative``, ``reward/mean``, ``reward/std``.
        """
        metrics: dict[str, float] = {
            "rollouts/rows": float(self.num_rows),
            "rollouts/episodes": float(self.num_episodes),
        }
        for status in RolloutStatus:
            metrics[f"rollouts/{status.value}"] = 0.0
        for status_value, count in self.status_counts.items():
            metrics[f"rollouts/{status_value}"] = float(count)
        metrics["rollouts/ok_fraction"] = (
            self.ok_episodes / self.num_episodes if self.num_episodes else math.nan
        )
        metrics["groups/count"] = float(self.num_groups)
        metrics["groups/degenerate"] = float(self.degenerate_groups)
        metrics["groups/zero_spread"] = float(self.zero_spread_groups)
        metrics["groups/informative"] = float(self.informative_groups)
        metrics["reward/mean"] = float(self.reward_mean)
        metrics["reward/std"] = float(self.reward_std)
        return {f"{prefix}{key}": value for key, value in metrics.items()}


@attrs.frozen(kw_only=True, eq=False)
class Advantages:
    """Per-row advantages of a ``Batch`` and the statistics behind them (arrays read-only)."""

    values: npt.NDArray[np.float32] = attrs.field(converter=_float32)
    """``[B]`` advantage of each row; 0.0 for rows that are not ``OK``, rows of failed
    episodes, and rows of degenerate or zero-spread groups."""
    rewards: FloatArray = attrs.field(converter=_float64)
    """``[B]`` scalar reward each row was scored with (``sum_k w_k * c_k`` under
    ``reward_weights``); NaN for rows that are not ``OK`` or whose episode is not."""
    group_index: IntArray = attrs.field(converter=_int64)
    """``[B]`` dense group number ``0 .. G-1`` of each row, in order of first appearance."""
    stats: AdvantageStats
    """Counts and reward statistics of the batch."""

    def __len__(self) -> int:
        return int(self.values.shape[0])


# --- array level -----------------------------------------------------------------------


_E = TypeVar("_E", bound=enum.StrEnum)


def _choice(kind: type[_E], value: _E | str, name: str) -> _E:
    try:
        return kind(value)
    except ValueError:
        allowed = ", ".join(repr(member.value) for member in kind)
        raise ConfigError(f"{name} must be one of {allowed}, got {value!r}") from None


def _check_epsilon(epsilon: float) -> float:
    if not (math.isfinite(epsilon) and epsilon >= 0.0):
        raise ConfigError(
            f"epsilon must be a finite number >= 0, got {epsilon!r} (the default is 1e-6)"
        )
    return float(epsilon)


def _dense(keys: Sequence[Hashable]) -> tuple[IntArray, list[Hashable]]:
    """``[N]`` dense ids ``0 .. G-1`` in order of first appearance, and the ``G`` keys."""
    first: dict[Hashable, int] = {}
    index_N = np.fromiter((first.setdefault(k, len(first)) for k in keys), np.int64, len(keys))
    return index_N, list(first)


@attrs.frozen(kw_only=True)
class _Normalized:
    """What ``_normalize`` computed for one reward vector."""

    advantages: FloatArray
    """``[N]`` advantages; 0 where not OK or the group teaches nothing."""
    ok_count: IntArray
    """``[G]`` OK episodes per group."""
    zero_spread: BoolArray
    """``[G]`` group has >= 2 OK episodes, all with the same reward."""


def _normalize(
    rewards_N: FloatArray,
    group_N: IntArray,
    ok_N: BoolArray,
    num_groups: int,
    scale: Scaling,
    leave_one_out: bool,
    epsilon: float,
) -> _Normalized:
    """Rules 1-5 of the module docstring for dense ``group_N`` (rewards of OK rows finite)."""
    N, G = rewards_N.shape[0], num_groups
    advantages_N = np.zeros(N, dtype=np.float64)
    # Only OK entries take part, sorted by (group, reward): the sums below then do not
    # depend on the order of the input, and failed entries cannot touch them.
    ok_idx_K = np.flatnonzero(ok_N)
    order_K = np.lexsort((rewards_N[ok_idx_K], group_N[ok_idx_K]))
    idx_K = ok_idx_K[order_K]
    r_K, g_K = rewards_N[idx_K], group_N[idx_K]
    n_G = np.bincount(g_K, minlength=G).astype(np.int64)
    zero_spread_G = np.zeros(G, dtype=np.bool_)
    K = r_K.shape[0]
    if K == 0:
        return _Normalized(advantages=advantages_N, ok_count=n_G, zero_spread=zero_spread_G)

    end_G = np.cumsum(n_G)
    start_G = end_G - n_G
    present_G = n_G > 0
    sum_G = np.zeros(G, dtype=np.float64)
    sum_G[present_G] = np.add.reduceat(r_K, start_G[present_G])
    mean_G = sum_G / np.maximum(n_G, 1)
    deviation_K = r_K - mean_G[g_K]
    square_G = np.zeros(G, dtype=np.float64)
    square_G[present_G] = np.add.reduceat(deviation_K * deviation_K, start_G[present_G])
    std_G = np.sqrt(square_G / np.maximum(n_G - 1, 1))  # ddof=1

    many_G = n_G >= 2
    # sorted within the group: constant iff its smallest and largest rewards are equal
    zero_spread_G[many_G] = r_K[start_G[many_G]] == r_K[end_G[many_G] - 1]
    active_G = many_G & ~zero_spread_G

    if leave_one_out:
        others_K = np.maximum(n_G[g_K] - 1, 1)
        centered_K = r_K - (sum_G[g_K] - r_K) / others_K
    else:
        centered_K = deviation_K
    if scale is Scaling.GROUP:
        denominator_K = std_G[g_K] + epsilon
    elif scale is Scaling.BATCH:
        batch_std = float(np.std(np.sort(r_K), ddof=1)) if K >= 2 else 0.0
        denominator_K = np.full(K, batch_std + epsilon)
    else:
        denominator_K = np.ones(K, dtype=np.float64)
    # a zero denominator (epsilon 0 with underflowing spread) gives 0, never inf or NaN
    denominator_K = np.where(denominator_K > 0.0, denominator_K, np.inf)
    advantages_K = np.where(active_G[g_K], centered_K / denominator_K, 0.0)
    advantages_N[idx_K] = advantages_K
    return _Normalized(advantages=advantages_N, ok_count=n_G, zero_spread=zero_spread_G)


def group_advantages(
    rewards: npt.ArrayLike,
    groups: Sequence[Hashable] | npt.NDArray[Any],
    ok: npt.ArrayLike,
    *,
    scale: Scaling | str = Scaling.GROUP,
    leave_one_out: bool = False,
    epsilon: float = 1e-6,
) -> FloatArray:
    """Group-relative advantages of ``N`` episodes (rules 1-5 of the module docstring).

    Args:
        rewards: ``[N]`` rewards; entries where ``ok`` is False are never read (any value,
            NaN included).
        groups: ``[N]`` group ids, any hashable values (row ids, ints).
        ok: ``[N]`` True where the episode counts (status ``OK``).
        scale: ``"group"``, ``"batch"`` or ``"none"`` (see ``Scaling``).
        leave_one_out: compare each episode with the mean of the *other* OK episodes.
        epsilon: added to the standard deviation before dividing.

    Returns:
        ``[N]`` float64 advantages, read-only; 0.0 where ``ok`` is False and in groups
        with fewer than two OK entries or no spread.

    Raises:
        ConfigError: arrays of different lengths or not 1-D, unknown ``scale``, bad
            ``epsilon``.
        DataError: a non-finite reward where ``ok`` is True.
    """
    scaling = _choice(Scaling, scale, "scale")
    eps = _check_epsilon(epsilon)
    rewards_N = np.asarray(rewards, dtype=np.float64)
    ok_N = np.asarray(ok, dtype=np.bool_)
    keys = groups.tolist() if isinstance(groups, np.ndarray) else list(groups)
    if rewards_N.ndim != 1 or ok_N.ndim != 1:
        raise ConfigError(
            f"rewards and ok must be 1-D, got shapes {rewards_N.shape} and {ok_N.shape}"
        )
    if not (rewards_N.shape[0] == ok_N.shape[0] == len(keys)):
        raise ConfigError(
            f"rewards, groups and ok must have one entry per episode, got lengths "
            f"{rewards_N.shape[0]}, {len(keys)} and {ok_N.shape[0]}"
        )
    bad_N = ok_N & ~np.isfinite(rewards_N)
    if bad_N.any():
        i = int(np.flatnonzero(bad_N)[0])
        raise DataError(
            f"reward {rewards_N[i]} at index {i} (group {keys[i]!r}) is not finite; give "
            f"the episode a finite reward or mark it not OK so that it leaves its group"
        )
    group_N, names = _dense(keys)
    normalized = _normalize(rewards_N, group_N, ok_N, len(names), scaling, leave_one_out, eps)
    advantages_N = normalized.advantages
    advantages_N.setflags(write=False)
    return advantages_N


# --- batch level -----------------------------------------------------------------------


def _check_row_ids(batch: Batch) -> tuple[str, ...]:
    missing = [b for b, row_id in enumerate(batch.row_ids) if row_id is None]
    if missing:
        shown = ", ".join(map(str, missing[:8])) + (", ..." if len(missing) > 8 else "")
        raise ConfigError(
            f"{len(missing)} of {len(batch)} batch rows have no row_id (rows {shown}): groups "
            f"need the stable id of the dataset row each rollout played. AgentClient sets "
            f"it; rollouts built by hand need Rollout(row_id=...) or "
            f"attrs.evolve(rollout, row_id=...)"
        )
    return tuple(str(row_id) for row_id in batch.row_ids)


def _weights(
    batch: Batch, reward_weights: Mapping[str, float] | None, aggregation: Aggregation
) -> dict[str, float] | None:
    available = sorted(batch.reward_components)
    if reward_weights is None:
        if aggregation is Aggregation.SUM:
            return None
        if not available:
            raise ConfigError(
                "aggregation='gdpo' normalizes each reward component separately, but no "
                "row of the batch has reward_components; use aggregation='sum' or an "
                "environment that reports reward_components"
            )
        return dict.fromkeys(available, 1.0)
    if not reward_weights:
        raise ConfigError(
            f"reward_weights is empty; name at least one component (available: {available}) "
            f"or pass None to use Batch.rewards"
        )
    unknown = sorted(set(reward_weights) - set(available))
    if unknown:
        raise ConfigError(
            f"reward_weights names components that no row of the batch has: {unknown}; "
            f"available components: {available}"
        )
    weights = {str(name): float(weight) for name, weight in reward_weights.items()}
    bad = {name: weight for name, weight in weights.items() if not math.isfinite(weight)}
    if bad:
        raise ConfigError(f"reward_weights must be finite numbers, got {bad}")
    return weights


def _component_rewards(
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
    for name in weights:
        values_B = np.asarray(batch.reward_components[name], dtype=np.float64)
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


def compute_advantages(
    batch: Batch,
    *,
    scale: Scaling | str = Scaling.GROUP,
    leave_one_out: bool = False,
    reward_weights: Mapping[str, float] | None = None,
    aggregation: Aggregation | str = Aggregation.SUM,
    gdpo_batch_norm: bool = True,
    epsilon: float = 1e-6,
) -> Advantages:
    """Per-row GRPO advantages of a collated ``Batch`` (rules 1-6 of the module docstring).

    Args:
        batch: rollouts collated by ``nemogym_sdk.collate``; every row needs a
            ``row_id``. Not modified.
        scale: ``"group"``, ``"batch"`` or ``"none"`` (see ``Scaling``).
        leave_one_out: compare each episode with the mean of the other OK episodes.
        reward_weights: ``{component: weight}``; when given, rewards come from
            ``Batch.reward_components`` instead of ``Batch.rewards``.
        aggregation: ``"sum"`` (weighted sum, then normalize) or ``"gdpo"`` (normalize
            each component, then the weighted sum; see ``Aggregation``).
        gdpo_batch_norm: under ``gdpo``, standardize the weighted sum over the batch.
        epsilon: added to every standard deviation before dividing.

    Raises:
        ConfigError: unknown ``scale`` or ``aggregation``, a bad ``epsilon`` or weight, a
            weight naming a component no row has, a row without ``row_id``.
        DataError: a non-finite reward on an OK row, an OK row lacking a weighted
            component, or samples of one episode with different row ids.
    """
    scaling = _choice(Scaling, scale, "scale")
    mode = _choice(Aggregation, aggregation, "aggregation")
    eps = _check_epsilon(epsilon)
    row_ids = _check_row_ids(batch)
    weights = _weights(batch, reward_weights, mode)
    B = len(batch)

    # Episodes: the first row of each episode_index carries its status and reward.
    _, first_E, episode_B = np.unique(batch.episode_index, return_index=True, return_inverse=True)
    first_E = first_E.astype(np.int64)
    episode_B = episode_B.reshape(-1).astype(np.int64)
    E = first_E.shape[0]
    group_B, group_names = _dense(row_ids)
    G = len(group_names)
    split_B = group_B != group_B[first_E][episode_B]
    if split_B.any():
        b = int(np.flatnonzero(split_B)[0])
        first = int(first_E[episode_B[b]])
        raise DataError(
            f"batch rows {first} and {b} are samples of one episode (episode_index "
            f"{int(batch.episode_index[b])}) but have different row ids {row_ids[first]!r} "
            f"and {row_ids[b]!r}; forks must keep their episode's row_id"
        )
    group_E = group_B[first_E]
    ok_B = np.asarray(batch.ok, dtype=np.bool_)
    ok_E = ok_B[first_E]

    if weights is None:
        reward_B = np.asarray(batch.rewards, dtype=np.float64)
        bad_B = ok_B & ~np.isfinite(reward_B)
        if bad_B.any():
            b = int(np.flatnonzero(bad_B)[0])
            raise DataError(
                f"batch row {b} (row_id {row_ids[b]!r}) is OK but its reward "
                f"{float(batch.rewards[b])} is not finite; an environment that cannot score "
                f"a rollout should fail it (a non-OK status) instead"
            )
        reward_E = np.where(ok_E, reward_B[first_E], np.nan)
        normalized = _normalize(reward_E, group_E, ok_E, G, scaling, leave_one_out, eps)
        advantage_E = normalized.advantages
        ok_count_G, zero_spread_G = normalized.ok_count, normalized.zero_spread
    else:
        components = _component_rewards(batch, weights, first_E, ok_B, row_ids)
        reward_E = np.zeros(E, dtype=np.float64)
        for name, weight in weights.items():
            reward_E += weight * np.where(ok_E, components[name], 0.0)
        reward_E = np.where(ok_E, reward_E, np.nan)
        if mode is Aggregation.SUM:
            normalized = _normalize(reward_E, group_E, ok_E, G, scaling, leave_one_out, eps)
            advantage_E = normalized.advantages
            ok_count_G, zero_spread_G = normalized.ok_count, normalized.zero_spread
        else:
            advantage_E, ok_count_G, zero_spread_G = _gdpo(
                components, weights, group_E, ok_E, G, scaling, leave_one_out, eps, gdpo_batch_norm
            )

    values_B = np.where(ok_B, advantage_E[episode_B], 0.0)
    scored_B = ok_B & ok_E[episode_B]
    rewards_B = np.where(scored_B, reward_E[episode_B], np.nan)
    ok_rewards = np.sort(reward_E[ok_E])
    status_counts = Counter(str(s) for s in np.asarray(batch.statuses)[first_E].tolist())
    order = {status.value: i for i, status in enumerate(RolloutStatus)}
    stats = AdvantageStats(
        num_rows=B,
        num_episodes=E,
        num_groups=G,
        status_counts=dict(
            sorted(status_counts.items(), key=lambda kv: (order.get(kv[0], len(order)), kv[0]))
        ),
        degenerate_groups=int(np.count_nonzero(ok_count_G < 2)),
        zero_spread_groups=int(np.count_nonzero(zero_spread_G)),
        reward_mean=float(ok_rewards.mean()) if ok_rewards.size else math.nan,
        reward_std=float(ok_rewards.std()) if ok_rewards.size else math.nan,
    )
    logger.debug(
        "advantages: %d rows, %d episodes (%d ok), %d groups (%d degenerate, %d zero spread)",
        B,
        E,
        stats.ok_episodes,
        G,
        stats.degenerate_groups,
        stats.zero_spread_groups,
    )
    return Advantages(values=values_B, rewards=rewards_B, group_index=group_B, stats=stats)


def _gdpo(
    components: Mapping[str, FloatArray],
    weights: Mapping[str, float],
    group_E: IntArray,
    ok_E: BoolArray,
    num_groups: int,
    scale: Scaling,
    leave_one_out: bool,
    epsilon: float,
    batch_norm: bool,
) -> tuple[FloatArray, IntArray, BoolArray]:
    """GDPO over ``E`` episodes: ``([E] advantages, [G] OK counts, [G] zero spread)``."""
    E = group_E.shape[0]
    summed_E = np.zeros(E, dtype=np.float64)
    ok_count_G = np.bincount(group_E[ok_E], minlength=num_groups).astype(np.int64)
    zero_spread_G = ok_count_G >= 2  # narrowed below: constant in every weighted component
    for name, weight in weights.items():
        normalized = _normalize(
            components[name], group_E, ok_E, num_groups, scale, leave_one_out, epsilon
        )
        summed_E += weight * normalized.advantages
        if weight != 0.0:
            zero_spread_G &= normalized.zero_spread
    active_G = (ok_count_G >= 2) & ~zero_spread_G
    if batch_norm:
        members_E = ok_E & (ok_count_G >= 2)[group_E]
        x_M = np.sort(summed_E[members_E])
        if x_M.size >= 2:
            mean, std = float(x_M.mean()), float(x_M.std(ddof=1))
            denominator = std + epsilon
            if denominator > 0.0:
                summed_E = np.where(members_E, (summed_E - mean) / denominator, 0.0)
    advantage_E = np.where(ok_E & active_G[group_E], summed_E, 0.0)
    return advantage_E, ok_count_G, zero_spread_G
