"""What ``compute_advantages`` returns, and the choices it takes (numpy and attrs only)."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any

import attrs
import numpy as np
import numpy.typing as npt

from nemogym_sdk.records import readonly_array

__all__ = ["AdvantageStats", "Advantages", "Aggregation", "Scaling"]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]


class Scaling(enum.StrEnum):
    """What the centered rewards are divided by (TRL's ``scale_rewards``)."""

    GROUP = "group"
    """The group's standard deviation of ``OK`` rewards (``ddof=1``): standard GRPO."""
    BATCH = "batch"
    """The standard deviation of every ``OK`` episode reward of the batch (``ddof=1``); under
    ``torch.distributed``, of every rank's batch (see ``compute_advantages``' ``gather``)."""
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
    """What one call to ``compute_advantages`` decided about the batch's groups.

    The step metrics a trainer logs (statuses, rewards, turns, tokens, and these group
    counts under the names every trainer uses) are ``nemogym_sdk.RolloutStats``, built
    from the batch and this record; this one holds only what the advantage computation
    alone knows.
    """

    num_rows: int
    """Rows of the batch (samples, forks included)."""
    num_episodes: int
    """Episodes of the batch (distinct ``episode_index`` values)."""
    ok_episodes: int
    """Episodes whose status is ``OK`` (the ones that take part in the baselines)."""
    num_groups: int
    """Groups (distinct row ids)."""
    degenerate_groups: int
    """Groups with fewer than two ``OK`` episodes: all their advantages are 0."""
    zero_spread_groups: int
    """Groups with at least two ``OK`` episodes whose rewards are all equal (under
    ``gdpo``: whose every weighted component is constant): all their advantages are 0."""
    partial_groups: int = 0
    """Groups with at least one episode that is not ``OK``: they teach from fewer than all
    their episodes (degenerate ones included)."""

    @property
    def informative_groups(self) -> int:
        """Groups that produce non-zero advantages: neither degenerate nor zero spread."""
        return self.num_groups - self.degenerate_groups - self.zero_spread_groups


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
    """Counts and reward statistics of the batch (this rank's batch under torchrun)."""

    def __len__(self) -> int:
        return int(self.values.shape[0])
