"""What ``RolloutEngine`` hands out (pure records; the rules it paces by: ``pacing``).

- ``Group``: one row played ``num_generations`` times; ``EngineStep``: a step's groups and
  how the sampler side fared; ``Leftover``: what ``close`` left untrained;
- ``EngineStalledError``: a step the pacing can never fill; ``EngineClosedError``: a step
  asked of a closed engine;
- ``Occupancy``: episodes in flight over time, between two hand-outs.
"""

from __future__ import annotations

import time

import attrs

from nemogym_sdk.errors import ConfigError, UsageError
from nemogym_sdk.records import Rollout, TaskRow

__all__ = [
    "EngineClosedError",
    "EngineStalledError",
    "EngineStep",
    "Group",
    "Leftover",
    "Occupancy",
    "Window",
]


class EngineStalledError(ConfigError):
    """The pacing allows no new group and too few are playing or finished for a step."""


class EngineClosedError(UsageError):
    """A step was asked of an engine that is closed (or was closed while it waited)."""


@attrs.frozen(kw_only=True)
class Group:
    """One row played ``num_generations`` times."""

    index: int
    """The group's number, in start order (its row is ``rows[index % len(rows)]``)."""
    row: TaskRow
    """The row it played."""
    started_on: int
    """How many versions had been published (`RolloutEngine.publish`) when the group
    started: it is trained at step ``started_on + max_staleness`` at the latest."""
    rollouts: tuple[Rollout, ...]
    """Its rollouts, by repeat index (failures included)."""
    seconds: float
    """Wall time from its start to its last episode's end."""

    @property
    def ok(self) -> int:
        """``OK`` rollouts in the group."""
        return sum(1 for rollout in self.rollouts if rollout.ok)


@attrs.frozen(kw_only=True)
class EngineStep:
    """What `RolloutEngine.next_step` hands the learner, and how the sampler side fared."""

    step: int
    """The engine's step count (0 for the first step it hands out)."""
    groups: tuple[Group, ...]
    """``groups_per_step`` whole groups, overdue ones first, then the oldest finished."""
    waited_s: float
    """Seconds `next_step` blocked before the groups were ready."""
    in_flight: int
    """Episodes still playing when the groups were handed out."""
    inflight_mean: float
    """Time-averaged episodes in flight since the previous step was handed out."""
    idle_fraction: float
    """Share of that time with no episode in flight (the sampler had nothing to do)."""
    groups_started: int
    """Groups started since the previous step was handed out."""
    cut: int = 0
    """Episodes cut since the previous step (``cut_stragglers``), as ``TIMEOUT`` failures."""

    def rollouts(self) -> list[Rollout]:
        """Every rollout of the step, group after group."""
        return [rollout for group in self.groups for rollout in group.rollouts]

    def metrics(self) -> dict[str, float]:
        """The step's engine metrics, by the names the reference trainer logs."""
        versions_behind = [self.step - g.started_on for g in self.groups]
        return {
            "engine_waited_s": self.waited_s,
            "engine_in_flight": float(self.in_flight),
            "engine_inflight_mean": self.inflight_mean,
            "engine_idle_fraction": self.idle_fraction,
            "engine_groups_started": float(self.groups_started),
            "engine_cut_episodes": float(self.cut),
            "engine_group_age_max": float(max(versions_behind, default=0)),
        }


@attrs.frozen(kw_only=True)
class Leftover:
    """What `RolloutEngine.close` left untrained, so nothing is lost silently."""

    drained: bool
    """True: episodes in flight were played to their end; False: they were cancelled."""
    requeue: tuple[int, ...]
    """Every group started but not handed to the learner, in start order: pass it as
    ``requeue=`` to a new engine (a resumed run) to play those rows again."""
    finished: tuple[Group, ...]
    """The finished groups among them (drained ones included)."""
    cancelled: int
    """Episodes cancelled while playing (0 when drained)."""
    next_index: int
    """The number the next new group gets (``next_index=`` of a resumed engine)."""


class Occupancy:
    """Episodes in flight over time, between two hand-outs."""

    def __init__(self) -> None:
        self._since = self._last = time.monotonic()
        self._area = 0.0
        self._idle = 0.0
        self.groups_started = 0
        self.cut = 0

    def change(self, before: int, after: int) -> None:
        now = time.monotonic()
        self._area += before * (now - self._last)
        if before == 0:
            self._idle += now - self._last
        self._last = now

    def close(self, current: int) -> Window:
        self.change(current, current)
        span = self._last - self._since
        window = Window(
            inflight_mean=self._area / span if span > 0 else float(current),
            idle_fraction=self._idle / span if span > 0 else 0.0,
            groups_started=self.groups_started,
            cut=self.cut,
        )
        self._since, self._area, self._idle = self._last, 0.0, 0.0
        self.groups_started = self.cut = 0
        return window


@attrs.frozen
class Window:
    inflight_mean: float
    idle_fraction: float
    groups_started: int
    cut: int
