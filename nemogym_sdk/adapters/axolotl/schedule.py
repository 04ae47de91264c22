"""Which rows each rank plays next: whole groups, seeded, the same plan on every rank.

Each produce call takes the next ``rows_per_rank * world`` rows of a seeded permutation of
the training set (a fresh permutation per epoch) and gives rank ``r`` the ``r``-th slice.
Every rank computes the same permutation from the seed, so no rank waits for another to
learn its rows, every group of ``num_generations`` rollouts of a row stays on one rank
(GRPO normalises within a group), and no two ranks play the same row in the same call.

Pure Python, no torch.
"""

from __future__ import annotations

import random

import attrs

from nemogym_sdk.errors import ConfigError

__all__ = ["GroupSchedule"]


def _at_least_one(instance: object, attribute: attrs.Attribute[int], value: int) -> None:
    if value < 1:
        raise ConfigError(f"{attribute.name} must be >= 1, got {value}")


@attrs.define(kw_only=True)
class GroupSchedule:
    """The rows (by index into the training set) this rank plays on each produce call."""

    num_rows: int = attrs.field(validator=_at_least_one)
    """Rows in the training set."""
    rows_per_rank: int = attrs.field(validator=_at_least_one)
    """Distinct rows (groups) one rank plays per call."""
    rank: int = 0
    """This process's rank."""
    world: int = attrs.field(default=1, validator=_at_least_one)
    """Number of processes."""
    seed: int = 0
    """Seed of the permutations."""
    shuffle: bool = True
    """Permute each epoch (False keeps file order)."""
    _epoch: int = attrs.field(default=0, init=False)
    _cursor: int = attrs.field(default=0, init=False)
    _order: list[int] = attrs.field(factory=list, init=False)

    def __attrs_post_init__(self) -> None:
        if not 0 <= self.rank < self.world:
            raise ConfigError(f"rank must be in [0, {self.world}), got {self.rank}")
        self._order = self._permutation(0)

    @property
    def epoch(self) -> int:
        """Epochs started so far, counting from 0."""
        return self._epoch

    def _permutation(self, epoch: int) -> list[int]:
        order = list(range(self.num_rows))
        if self.shuffle:
            random.Random(f"{self.seed}:{epoch}").shuffle(order)
        return order

    def _take(self, count: int) -> list[int]:
        taken: list[int] = []
        while len(taken) < count:
            if self._cursor == self.num_rows:
                self._epoch += 1
                self._cursor = 0
                self._order = self._permutation(self._epoch)
            step = min(count - len(taken), self.num_rows - self._cursor)
            taken += self._order[self._cursor : self._cursor + step]
            self._cursor += step
        return taken

    def rank_order(self) -> list[int]:
        """This rank's rows for a player that cycles through them (``RolloutEngine``): the
        first epoch's permutation, every ``world``-th row from this rank's own (all of them
        when there are fewer rows than ranks). Does not move the schedule."""
        order = self._permutation(0)
        return order[self.rank :: self.world] or order

    def next_indices(self) -> list[int]:
        """Row indices for this rank's next call (``rows_per_rank`` of them)."""
        everyone = self._take(self.rows_per_rank * self.world)
        start = self.rank * self.rows_per_rank
        return everyone[start : start + self.rows_per_rank]
