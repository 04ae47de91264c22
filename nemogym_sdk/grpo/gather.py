"""Batch statistics across ranks: the ``gather`` hook of ``compute_advantages`` (no torch).

Under ``torchrun`` each rank computes advantages on its own shard of whole groups. Group
statistics need nothing else; the *batch* statistics (``scale="batch"``, GDPO's batch
normalisation) need every rank's rewards. ``compute_advantages(..., gather=hook)`` takes
a hook that all-gathers small numpy arrays; ``nemogym_sdk.adapters.torch.all_gather_array``
is the one for ``torch.distributed``. This module only calls the hook: it never imports
torch. It asks ``nemogym_sdk.ranks`` whether a process group is up, so that a batch
statistic is never silently computed on one rank's shard.

Every rank makes the same calls in the same order, whatever its shard holds (a rank with no
``OK`` rollout still takes part), and a problem found on one rank's data is shared first,
so that every rank raises instead of some waiting forever in a collective.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from nemogym_sdk import ranks
from nemogym_sdk.errors import ConfigError, DataError
from nemogym_sdk.grpo.results import BoolArray, FloatArray

__all__ = ["Gather"]

Gather = Callable[[FloatArray], FloatArray]
"""All-gather of a small 1-D float64 array: called on every rank with that rank's array
(lengths may differ between ranks), it returns the concatenation of every rank's array in
rank order, values unchanged (``nemogym_sdk.adapters.torch.all_gather_array``). A batch
that already holds every rank's rollouts takes ``lambda values: values``."""


def required(gather: Gather | None, statistic: str | None) -> Gather | None:
    """The hook to use for ``statistic`` (None when there is no batch statistic, or one
    process); a ConfigError when a process group is up and no hook was given."""
    if statistic is None:
        return None
    if gather is None and ranks.world_size() > 1:
        raise ConfigError(
            f"{statistic} is a batch statistic, but torch.distributed is initialised with "
            f"{ranks.world_size()} ranks and each rank holds only its shard; pass "
            f"gather=nemogym_sdk.adapters.torch.all_gather_array to compute it over every "
            f"rank's batch (or gather=lambda values: values when this batch already holds "
            f"every rank's rollouts)"
        )
    return gather


def everyone(gather: Gather | None, values: FloatArray) -> FloatArray:
    """Every rank's ``values`` concatenated (``values`` itself without a hook)."""
    if gather is None:
        return values
    local = np.ascontiguousarray(values, dtype=np.float64).reshape(-1)
    out = np.asarray(gather(local), dtype=np.float64)
    if out.ndim != 1 or out.shape[0] < local.shape[0]:
        raise ConfigError(
            f"gather must return a 1-D array holding every rank's values, got shape "
            f"{out.shape} for {local.shape[0]} local values"
        )
    return out


def agree(gather: Gather | None, failed: bool, present: BoolArray) -> tuple[BoolArray, bool]:
    """Share whether this rank's data failed its checks and which weighted components its
    batch has: ``(present on some rank, failed on another rank)``."""
    if gather is None:
        return present, False
    flags = np.concatenate([[1.0 if failed else 0.0], present.astype(np.float64)])
    width = flags.shape[0]
    table = everyone(gather, flags)
    if table.shape[0] % width:
        raise ConfigError(
            "every rank must pass the same reward_weights to compute_advantages (the "
            "gathered flags do not divide into ranks)"
        )
    table = table.reshape(-1, width)
    others_failed = bool(table[:, 0].sum() > (1.0 if failed else 0.0))
    return np.asarray(table[:, 1:].any(axis=0), dtype=np.bool_), others_failed


def other_rank_failed() -> DataError:
    """The error every rank raises when another rank's batch failed its checks."""
    return DataError(
        "another rank's batch failed compute_advantages' checks (see that rank's error); "
        "every rank stops rather than wait in a collective"
    )
