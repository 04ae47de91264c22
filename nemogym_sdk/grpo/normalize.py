"""Rules 1-5 of ``nemogym_sdk.grpo`` on one reward vector, and ``group_advantages``."""

from __future__ import annotations

import enum
import math
from collections.abc import Hashable, Sequence
from typing import Any, TypeVar

import attrs
import numpy as np
import numpy.typing as npt

from nemogym_sdk.errors import ConfigError, DataError, NemoGymError
from nemogym_sdk.grpo.gather import Gather, agree, everyone, other_rank_failed, required
from nemogym_sdk.grpo.results import BoolArray, FloatArray, IntArray, Scaling

__all__ = ["group_advantages"]

DEFAULT_EPSILON = 1e-6
"""Added to every standard deviation before dividing (TRL adds 1e-4; pass that to match)."""

_E = TypeVar("_E", bound=enum.StrEnum)


def choice(kind: type[_E], value: _E | str, name: str) -> _E:
    """``value`` as a member of ``kind``, or a ConfigError listing the members."""
    try:
        return kind(value)
    except ValueError:
        allowed = ", ".join(repr(member.value) for member in kind)
        raise ConfigError(f"{name} must be one of {allowed}, got {value!r}") from None


def check_epsilon(epsilon: float) -> float:
    """``epsilon`` as a float, or a ConfigError unless finite and >= 0."""
    if not (math.isfinite(epsilon) and epsilon >= 0.0):
        raise ConfigError(
            f"epsilon must be a finite number >= 0, got {epsilon!r} (the default is "
            f"{DEFAULT_EPSILON})"
        )
    return float(epsilon)


def dense(keys: Sequence[Hashable]) -> tuple[IntArray, list[Hashable]]:
    """``[N]`` dense ids ``0 .. G-1`` in order of first appearance, and the ``G`` keys."""
    first: dict[Hashable, int] = {}
    index_N = np.fromiter((first.setdefault(k, len(first)) for k in keys), np.int64, len(keys))
    return index_N, list(first)


def sample_std(values: FloatArray) -> float:
    """``ddof=1`` standard deviation over the values sorted (so in any order the same bits);
    0.0 for fewer than two values."""
    return float(np.std(np.sort(values), ddof=1)) if values.shape[0] >= 2 else 0.0


@attrs.frozen(kw_only=True)
class Normalized:
    """What ``normalize`` computed for one reward vector."""

    advantages: FloatArray
    """``[N]`` advantages; 0 where not OK or the group teaches nothing."""
    ok_count: IntArray
    """``[G]`` OK episodes per group."""
    zero_spread: BoolArray
    """``[G]`` group has >= 2 OK episodes, all with the same reward."""


def normalize(
    rewards_N: FloatArray,
    group_N: IntArray,
    ok_N: BoolArray,
    num_groups: int,
    scale: Scaling,
    leave_one_out: bool,
    epsilon: float,
    gather: Gather | None = None,
) -> Normalized:
    """Rules 1-5 for dense ``group_N`` (rewards of OK rows finite); ``gather`` makes the
    ``batch`` scale the standard deviation over every rank's OK rewards."""
    N, G = rewards_N.shape[0], num_groups
    advantages_N = np.zeros(N, dtype=np.float64)
    # Only OK entries take part, sorted by (group, reward): the sums below then do not
    # depend on the order of the input, and failed entries cannot touch them.
    ok_idx_K = np.flatnonzero(ok_N)
    order_K = np.lexsort((rewards_N[ok_idx_K], group_N[ok_idx_K]))
    idx_K = ok_idx_K[order_K]
    r_K, g_K = rewards_N[idx_K], group_N[idx_K]
    # before any early return: every rank takes part in the gather
    batch_std = sample_std(everyone(gather, r_K)) if scale is Scaling.BATCH else 0.0
    n_G = np.bincount(g_K, minlength=G).astype(np.int64)
    zero_spread_G = np.zeros(G, dtype=np.bool_)
    K = r_K.shape[0]
    if K == 0:
        return Normalized(advantages=advantages_N, ok_count=n_G, zero_spread=zero_spread_G)

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
        denominator_K = np.full(K, batch_std + epsilon)
    else:
        denominator_K = np.ones(K, dtype=np.float64)
    # a zero denominator (epsilon 0 with underflowing spread) gives 0, never inf or NaN
    denominator_K = np.where(denominator_K > 0.0, denominator_K, np.inf)
    advantages_K = np.where(active_G[g_K], centered_K / denominator_K, 0.0)
    advantages_N[idx_K] = advantages_K
    return Normalized(advantages=advantages_N, ok_count=n_G, zero_spread=zero_spread_G)


def _arrays(
    rewards: npt.ArrayLike, keys: list[Hashable], ok: npt.ArrayLike
) -> tuple[FloatArray, BoolArray]:
    rewards_N = np.asarray(rewards, dtype=np.float64)
    ok_N = np.asarray(ok, dtype=np.bool_)
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
    return rewards_N, ok_N


def group_advantages(
    rewards: npt.ArrayLike,
    groups: Sequence[Hashable] | npt.NDArray[Any],
    ok: npt.ArrayLike,
    *,
    scale: Scaling | str = Scaling.GROUP,
    leave_one_out: bool = False,
    epsilon: float = DEFAULT_EPSILON,
    gather: Gather | None = None,
) -> FloatArray:
    """Group-relative advantages of ``N`` episodes (rules 1-5 of ``nemogym_sdk.grpo``).

    Args:
        rewards: ``[N]`` rewards; entries where ``ok`` is False are never read (any value,
            NaN included).
        groups: ``[N]`` group ids, any hashable values (row ids, ints).
        ok: ``[N]`` True where the episode counts (status ``OK``).
        scale: ``"group"``, ``"batch"`` or ``"none"`` (see ``Scaling``).
        leave_one_out: compare each episode with the mean of the *other* OK episodes.
        epsilon: added to the standard deviation before dividing.
        gather: all-gather hook for ``scale="batch"`` across ranks (see ``Gather``); needed
            when ``torch.distributed`` is initialised.

    Returns:
        ``[N]`` float64 advantages, read-only; 0.0 where ``ok`` is False and in groups
        with fewer than two OK entries or no spread.

    Raises:
        ConfigError: arrays of different lengths or not 1-D, unknown ``scale``, bad
            ``epsilon``, ``scale="batch"`` under torch.distributed without ``gather``.
        DataError: a non-finite reward where ``ok`` is True (or on another rank).
    """
    scaling = choice(Scaling, scale, "scale")
    eps = check_epsilon(epsilon)
    hook = required(gather, "scale='batch'" if scaling is Scaling.BATCH else None)
    keys = groups.tolist() if isinstance(groups, np.ndarray) else list(groups)
    problem: NemoGymError | None = None
    try:
        rewards_N, ok_N = _arrays(rewards, keys, ok)
    except NemoGymError as exc:
        problem = exc
    _, others_failed = agree(hook, problem is not None, np.zeros(0, dtype=np.bool_))
    if problem is not None:
        raise problem
    if others_failed:
        raise other_rank_failed()
    group_N, names = dense(keys)
    normalized = normalize(rewards_N, group_N, ok_N, len(names), scaling, leave_one_out, eps, hook)
    advantages_N = normalized.advantages
    advantages_N.setflags(write=False)
    return advantages_N
