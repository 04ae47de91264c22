"""``RolloutEngine``: rollouts keep playing while the learner learns (asynchronous GRPO).

A synchronous trainer plays a step's groups, waits for the slowest episode, learns, and
repeats: with heavy-tailed episode lengths the sampler idles behind the stragglers. The
engine keeps up to ``max_inflight`` episodes playing through an ``AgentClient`` (on the
client's loop thread), and hands the learner whole groups as they complete::

    with RolloutEngine(client, rows, eos_token_id=eos, num_generations=8,
                       groups_per_step=4, max_staleness=1) as engine:
        for step in range(steps):
            played = engine.next_step()                 # 4 whole groups
            learn(played.rollouts())
            engine.publish(sync.sync(model).version)    # the sampler serves the new adapter

**Staleness is bounded by pacing, not by discarding.** Groups are numbered in the order
they start (group ``n`` plays ``rows[n % len(rows)]``, as the synchronous trainer's steps
do). With ``p`` versions published since the engine started, a new group may start only
while fewer than ``(p + max_staleness + 1) * groups_per_step`` have started; and step
``s`` (0-based) must include every group that started at ``p <= s - max_staleness``,
waiting for it if it is still playing. Together (each step taking ``groups_per_step``
groups, the overdue ones first, then the oldest finished) no group is trained more than
``max_staleness`` versions after the version it started on, whatever order episodes finish
in; ``max_staleness = 0`` is exactly the synchronous schedule. The bound assumes one
``publish`` per step; the learner's exact staleness comes from the rollouts' own versions
(``Batch.staleness``).

**A stuck episode cannot hold the learner:** each episode has a deadline
(``episode_timeout``) and ends there as a ``TIMEOUT`` failure. Failed episodes stay in their
group (``compute_advantages`` leaves them out of the baseline, and a group still teaches
when two or more are ``OK``).

**Nothing is lost:** every group started comes out once, handed to the learner by
`next_step`, or, at `close`, as a `Leftover` that says which groups were not trained (in
flight, drained or cancelled, and finished ones) so a resumed run can play them again
(``requeue=``); the counts are logged.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import threading
import time
from collections.abc import Iterable, Sequence
from types import TracebackType
from typing import Any, Self

import attrs

from nemogym_sdk._aio import BackgroundLoop
from nemogym_sdk.client import AgentClient
from nemogym_sdk.errors import ConfigError
from nemogym_sdk.records import ParseOptions, Rollout, RolloutRequest, TaskRow

__all__ = [
    "EngineStalledError",
    "EngineStep",
    "Group",
    "Leftover",
    "RolloutEngine",
    "is_due",
    "may_start",
]

logger = logging.getLogger(__name__)

_DEFAULT_PARSE = ParseOptions()


def may_start(started: int, published: int, max_staleness: int, groups_per_step: int) -> bool:
    """The pacing rule: with ``started`` groups started and ``published`` versions published
    since the start, may another group start?"""
    return started < (published + max_staleness + 1) * groups_per_step


def is_due(started_on: int, step: int, max_staleness: int) -> bool:
    """Must step ``step`` include a group that started after ``started_on`` publishes?"""
    return started_on <= step - max_staleness


class EngineStalledError(ConfigError):
    """The pacing allows no new group and too few are playing or finished for a step."""


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


class RolloutEngine:
    """Plays groups ahead of the learner, within a staleness bound (see the module doc).

    Args:
        client: plays the episodes (its ``sampling`` is forced onto every row).
        rows: the dataset; group ``n`` plays ``rows[n % len(rows)]``.
        eos_token_id: the one token of a failed rollout.
        num_generations: rollouts per group.
        groups_per_step: groups `next_step` hands out.
        max_staleness: versions a group may be trained behind the one it started on.
        max_inflight: episodes playing at once (default: every episode the pacing allows,
            ``(max_staleness + 1) * groups_per_step * num_generations``).
        episode_timeout: seconds an episode may play before it ends as ``TIMEOUT``.
        parse: how ``/run`` results become rollouts.
        requeue: group numbers to play first (a resumed run's `Leftover.requeue`).
        next_index: the number of the first new group (`Leftover.next_index`).
    """

    def __init__(
        self,
        client: AgentClient,
        rows: Sequence[TaskRow],
        *,
        eos_token_id: int,
        num_generations: int,
        groups_per_step: int,
        max_staleness: int = 0,
        max_inflight: int | None = None,
        episode_timeout: float | None = None,
        parse: ParseOptions = _DEFAULT_PARSE,
        requeue: Iterable[int] = (),
        next_index: int = 0,
    ) -> None:
        if not rows:
            raise ConfigError("RolloutEngine needs at least one row")
        for name, value in (
            ("num_generations", num_generations),
            ("groups_per_step", groups_per_step),
        ):
            if value < 1:
                raise ConfigError(f"{name} must be >= 1, got {value}")
        if max_staleness < 0:
            raise ConfigError(f"max_staleness must be >= 0, got {max_staleness}")
        if max_inflight is None:
            max_inflight = (max_staleness + 1) * groups_per_step * num_generations
        if max_inflight < num_generations:
            raise ConfigError(
                f"max_inflight={max_inflight} cannot hold one group of {num_generations} "
                "episodes: the engine starts whole groups"
            )
        if episode_timeout is not None and not episode_timeout > 0:
            raise ConfigError(f"episode_timeout must be > 0 seconds, got {episode_timeout}")
        self.client = client
        self.rows = list(rows)
        self.eos_token_id = eos_token_id
        self.num_generations = num_generations
        self.groups_per_step = groups_per_step
        self.max_staleness = max_staleness
        self.max_inflight = max_inflight
        self.episode_timeout = episode_timeout
        self.parse = parse
        self._cond = threading.Condition()
        self._requeue = collections.deque(sorted(set(requeue)))
        self._next_index = next_index
        self._published = 0  # versions published since the start (relative)
        self._version: int | None = None  # the last absolute version published
        self._started = 0
        self._steps = 0
        self._playing: dict[int, int] = {}  # group -> relative version it started on
        self._finished: dict[int, Group] = {}
        self._episodes = 0  # episodes in flight
        self._error: BaseException | None = None
        self._closing = False
        self._tasks: set[asyncio.Task[None]] = set()
        self._loop: BackgroundLoop | None = None
        self._wake: asyncio.Event | None = None
        self._pump_done: Any = None
        self._window = _Occupancy()

    # --- the learner's side -----------------------------------------------------------------

    def start(self) -> Self:
        """Start playing, on the loop thread of the client's synchronous methods."""
        if self._loop is not None:
            raise ConfigError("this RolloutEngine has already been started")
        self._loop = self.client._background_loop()  # the sync facade's loop thread
        self._pump_done = self._loop.submit(self._pump())
        return self

    def publish(self, version: int | None = None) -> None:
        """The sampler now serves a new adapter version: the pacing lets more groups start.

        Call it once per learner step, after the sync (``LoraSync.sync``).
        """
        with self._cond:
            if version is not None and self._version is not None and version <= self._version:
                raise ConfigError(
                    f"published version {version} does not follow {self._version}: versions "
                    "must increase"
                )
            self._version = version
            self._published += 1
            self._cond.notify_all()
        self._poke()

    def next_step(self, timeout: float | None = None) -> EngineStep:
        """Block until a step's groups are ready (the overdue ones finished); hand them out.

        Raises the error that stopped a group (a row that cannot be sent, an unknown
        agent), ``EngineStalledError`` when the pacing can never fill the step (too few
        `publish` calls), or ``TimeoutError`` after ``timeout`` seconds.
        """
        if self._loop is None:
            raise ConfigError("start() the RolloutEngine first")
        began = time.monotonic()
        with self._cond:
            while not self._ready():
                if self._error is not None:
                    raise self._error
                if self._stalled():
                    raise EngineStalledError(
                        f"step {self._steps} needs {self.groups_per_step} groups but "
                        f"{len(self._finished)} are finished, none is playing, and "
                        f"max_staleness={self.max_staleness} lets no new group start until a "
                        "new version is published: call publish() after every adapter sync"
                    )
                left = None if timeout is None else timeout - (time.monotonic() - began)
                if left is not None and left <= 0:
                    raise TimeoutError(f"no step ready after {timeout} s")
                self._cond.wait(left)
            groups = self._take()
            window = self._window.close(self._episodes)
            step = EngineStep(
                step=self._steps,
                groups=groups,
                waited_s=time.monotonic() - began,
                in_flight=self._episodes,
                inflight_mean=window.inflight_mean,
                idle_fraction=window.idle_fraction,
                groups_started=window.groups_started,
            )
            self._steps += 1
        return step

    def pending(self) -> tuple[tuple[int, ...], int]:
        """(the groups started but not handed out yet, the next new group's number): what a
        checkpoint records so that a resumed run plays them again (``requeue=``,
        ``next_index=``)."""
        with self._cond:
            untrained = sorted({*self._finished, *self._playing, *self._requeue})
            return tuple(untrained), self._next_index

    def close(self, *, drain: bool = False) -> Leftover:
        """Stop starting groups; let the playing ones finish (``drain``) or cancel them.

        Returns what was not trained; logs the counts.
        """
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        self._poke()
        cancelled = 0
        if self._loop is not None:
            if drain:
                with self._cond:
                    while self._playing and self._error is None:
                        self._cond.wait()
            cancelled = self._loop.submit(self._cancel_all()).result()
            if self._pump_done is not None:
                self._pump_done.result()
            self._loop = None  # the client's: it closes it
        with self._cond:
            finished = tuple(self._finished[i] for i in sorted(self._finished))
            requeue = tuple(sorted({*self._finished, *self._playing, *self._requeue}))
            self._playing.clear()
            leftover = Leftover(
                drained=drain,
                requeue=requeue,
                finished=finished,
                cancelled=cancelled,
                next_index=self._next_index,
            )
        if requeue:
            logger.info(
                "rollout engine closed: %d group(s) not trained (%d finished, %d episode(s) %s), "
                "to requeue: %s",
                len(requeue),
                len(finished),
                cancelled,
                "cancelled" if not drain else "drained",
                list(requeue),
            )
        return leftover

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self._loop is not None:
            self.close()

    # --- pacing -------------------------------------------------------------------------------

    def _may_start(self) -> bool:
        return may_start(self._started, self._published, self.max_staleness, self.groups_per_step)

    def _due(self) -> list[int]:
        """Groups step ``self._steps`` must include: started ``max_staleness`` or more
        versions ago."""
        step, k = self._steps, self.max_staleness
        due = [i for i, v in self._playing.items() if is_due(v, step, k)]
        due += [i for i, g in self._finished.items() if is_due(g.started_on, step, k)]
        return due

    def _ready(self) -> bool:
        due = self._due()
        return all(i in self._finished for i in due) and len(self._finished) >= self.groups_per_step

    def _stalled(self) -> bool:
        return not self._playing and not self._closing and not self._may_start()

    def _take(self) -> tuple[Group, ...]:
        due = set(self._due())
        order = sorted(
            self._finished.values(), key=lambda g: (g.index not in due, g.started_on, g.index)
        )
        taken = order[: self.groups_per_step]
        for group in taken:
            del self._finished[group.index]
        return tuple(taken)

    def _startable(self) -> list[tuple[int, int]]:
        """Groups to start now (their numbers and the relative version), under the lock."""
        out: list[tuple[int, int]] = []
        while (
            not self._closing
            and self._error is None
            and self._episodes + self.num_generations <= self.max_inflight
            and self._may_start()
        ):
            if self._requeue:
                index = self._requeue.popleft()
            else:
                index, self._next_index = self._next_index, self._next_index + 1
            self._started += 1
            self._playing[index] = self._published
            self._window.change(self._episodes, self._episodes + self.num_generations)
            self._episodes += self.num_generations
            self._window.groups_started += 1
            out.append((index, self._published))
        return out

    # --- the loop thread ------------------------------------------------------------------

    def _poke(self) -> None:
        loop, wake = self._loop, self._wake
        if loop is not None and wake is not None:
            loop.loop.call_soon_threadsafe(wake.set)

    async def _pump(self) -> None:
        self._wake = asyncio.Event()
        while True:
            self._wake.clear()
            with self._cond:
                if self._closing:
                    return
                starts = self._startable()
            for index, version in starts:
                task = asyncio.ensure_future(self._play_group(index, version))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
            await self._wake.wait()

    async def _play_group(self, index: int, version: int) -> None:
        row = self.rows[index % len(self.rows)]
        began = time.monotonic()
        try:
            rollouts = await asyncio.gather(
                *(
                    self._play_one(RolloutRequest(row=row, repeat_index=i))
                    for i in range(self.num_generations)
                )
            )
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - handed to the learner by next_step
            with self._cond:
                self._error = self._error or exc
                if self._playing.pop(index, None) is not None:
                    self._requeue.appendleft(index)  # not lost: close() lists it
                self._cond.notify_all()
            return
        group = Group(
            index=index,
            row=row,
            started_on=version,
            rollouts=tuple(rollouts),
            seconds=time.monotonic() - began,
        )
        with self._cond:
            if self._playing.pop(index, None) is not None:
                self._finished[index] = group
            self._cond.notify_all()
        assert self._wake is not None
        self._wake.set()

    async def _play_one(self, request: RolloutRequest) -> Rollout:
        try:
            return await self.client.play(
                request,
                eos_token_id=self.eos_token_id,
                parse=self.parse,
                timeout=self.episode_timeout,
            )
        finally:
            with self._cond:
                self._window.change(self._episodes, self._episodes - 1)
                self._episodes -= 1
            if self._wake is not None:
                self._wake.set()

    async def _cancel_all(self) -> int:
        with self._cond:
            cancelled = self._episodes
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        return cancelled


class _Occupancy:
    """Episodes in flight over time, between two hand-outs."""

    def __init__(self) -> None:
        self._since = self._last = time.monotonic()
        self._area = 0.0
        self._idle = 0.0
        self.groups_started = 0

    def change(self, before: int, after: int) -> None:
        now = time.monotonic()
        self._area += before * (now - self._last)
        if before == 0:
            self._idle += now - self._last
        self._last = now

    def close(self, current: int) -> _Window:
        self.change(current, current)
        span = self._last - self._since
        window = _Window(
            inflight_mean=self._area / span if span > 0 else float(current),
            idle_fraction=self._idle / span if span > 0 else 0.0,
            groups_started=self.groups_started,
        )
        self._since, self._area, self._idle, self.groups_started = self._last, 0.0, 0.0, 0
        return window


@attrs.frozen
class _Window:
    inflight_mean: float
    idle_fraction: float
    groups_started: int
