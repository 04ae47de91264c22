"""``RolloutEngine``: rollouts keep playing while the learner learns (asynchronous GRPO).

A synchronous trainer plays a step's groups, waits for the slowest episode, learns, and
repeats: with heavy-tailed episode lengths the sampler idles behind the stragglers. The
engine keeps up to ``max_inflight`` episodes playing through an ``AgentClient`` (on the
client's loop thread), and hands the learner whole groups as they complete::

    options = EngineOptions(num_generations=8, groups_per_step=4, max_staleness=1)
    with RolloutEngine(client, rows, options, eos_token_id=eos) as engine:
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
groups, the overdue ones first, then the oldest finished, and waiting instead when taking a
fresher finished group would leave a later step more due groups than it can take,
``pacing.keeps_bound``) no group is trained more than ``max_staleness`` versions after the
version it started on, whatever order episodes finish in; ``max_staleness = 0`` is exactly
the synchronous schedule. The bound assumes one ``publish`` per step; the learner's exact
staleness comes from the rollouts' own versions (``Batch.staleness``).

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

from nemogym_sdk._net.aio import BackgroundLoop
from nemogym_sdk.client import AgentClient
from nemogym_sdk.data import rollout_seed
from nemogym_sdk.errors import ConfigError, UsageError
from nemogym_sdk.records import Rollout, RolloutRequest, RolloutStatus, TaskRow
from nemogym_sdk.rollout_engine.groups import (
    EngineClosedError,
    EngineStalledError,
    EngineStep,
    Group,
    Leftover,
    Occupancy,
)
from nemogym_sdk.rollout_engine.options import EngineOptions
from nemogym_sdk.rollout_engine.pacing import is_due, keeps_bound, may_start, take_order
from nemogym_sdk.turns import stamp

__all__ = ["RolloutEngine"]

logger = logging.getLogger(__name__)


class RolloutEngine:
    """Plays groups ahead of the learner, within a staleness bound (see the module doc).

    Args:
        client: plays the episodes (its ``sampling`` is forced onto every row).
        rows: the dataset; group ``n`` plays ``rows[n % len(rows)]``.
        options: how it plays (`EngineOptions`: group size, groups per step, the staleness
            bound, episodes in flight, the episode deadline, cutting stragglers, parsing).
        eos_token_id: the one token of a failed rollout.
        requeue: group numbers to play first (a resumed run's `Leftover.requeue`).
        next_index: the number of the first new group (`Leftover.next_index`).
    """

    def __init__(
        self,
        client: AgentClient,
        rows: Sequence[TaskRow],
        options: EngineOptions,
        *,
        eos_token_id: int,
        requeue: Iterable[int] = (),
        next_index: int = 0,
    ) -> None:
        if not rows:
            raise ConfigError("RolloutEngine needs at least one row")
        if not isinstance(options, EngineOptions):
            raise ConfigError(
                f"options must be an EngineOptions, got {type(options).__name__}: build one "
                "with EngineOptions(num_generations=..., groups_per_step=..., ...)"
            )
        self.client = client
        self.rows = list(rows)
        self.options = options
        self.eos_token_id = eos_token_id
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
        self._closed = threading.Event()  # set when close() has returned its leftover
        self._tasks: set[asyncio.Task[None]] = set()
        self._members: dict[int, list[Rollout | None]] = {}
        self._member_tasks: dict[int, list[asyncio.Task[None]]] = {}
        self._began: dict[int, float] = {}
        self._loop: BackgroundLoop | None = None
        self._wake: asyncio.Event | None = None
        self._pump_done: Any = None
        self._window = Occupancy()

    # --- the learner's side -----------------------------------------------------------------

    def start(self) -> Self:
        """Start playing, on the loop thread of the client's synchronous methods."""
        if self._loop is not None:
            raise UsageError("this RolloutEngine has already been started: make a new one")
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

    def next_step(
        self, timeout: float | None = None, *, wait_for_publish: bool = False
    ) -> EngineStep:
        """Block until a step's groups are ready (the overdue ones finished); hand them out.

        Raises the error that stopped a group (a row that cannot be sent, an unknown
        agent), ``EngineStalledError`` when the pacing can never fill the step (too few
        `publish` calls), ``EngineClosedError`` when the engine is closed while it waits, or
        ``TimeoutError`` after ``timeout`` seconds. With ``wait_for_publish`` a step the
        pacing cannot fill yet waits for the next `publish` instead (the learner publishes
        from another thread, e.g. a trainer callback, while this one prefetches).
        """
        if self._loop is None:
            raise UsageError("start() the RolloutEngine first (or use it as a context manager)")
        began = time.monotonic()
        with self._cond:
            while not self._ready():
                if self._error is not None:
                    raise self._error
                if self._closing:
                    break
                if self._stalled() and not wait_for_publish:
                    raise EngineStalledError(
                        f"step {self._steps} needs {self.options.groups_per_step} groups but "
                        f"{len(self._finished)} are finished, none is playing, and "
                        f"max_staleness={self.options.max_staleness} lets no new group start "
                        "until a new version is published: call publish() after every adapter sync"
                    )
                left = None if timeout is None else timeout - (time.monotonic() - began)
                if left is not None and left <= 0:
                    raise TimeoutError(f"no step ready after {timeout} s")
                self._cond.wait(left)
            else:
                return self._hand_out(began)
        # Closed while waiting: raise once close() has finished (on whichever thread called
        # it), so that the caller may close the client next without racing it.
        self._closed.wait()
        raise EngineClosedError(
            f"the rollout engine was closed while step {self._steps} waited for its groups"
        )

    def _hand_out(self, began: float) -> EngineStep:
        """The next step from the finished groups (under the lock, when ready)."""
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
            cut=window.cut,
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
        try:
            return self._close(drain)
        finally:
            self._closed.set()

    def _close(self, drain: bool) -> Leftover:
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
        return may_start(
            self._started, self._published, self.options.max_staleness, self.options.groups_per_step
        )

    def _due(self) -> list[int]:
        """Groups step ``self._steps`` must include: started ``max_staleness`` or more
        versions ago."""
        step, k = self._steps, self.options.max_staleness
        due = [i for i, v in self._playing.items() if is_due(v, step, k)]
        due += [i for i, g in self._finished.items() if is_due(g.started_on, step, k)]
        return due

    def _ready(self) -> bool:
        due = self._due()
        self._cut_stragglers(due)
        size = self.options.groups_per_step
        if not all(i in self._finished for i in due) or len(self._finished) < size:
            return False
        if not self._playing:  # nothing older to wait for
            return True
        taken = take_order(self._finished.values(), set(due))[:size]
        untrained = [*self._playing.values(), *(g.started_on for g in self._finished.values())]
        started = [g.started_on for g in taken]
        return keeps_bound(started, untrained, self._steps, self.options.max_staleness, size)

    def _stalled(self) -> bool:
        return not self._playing and not self._closing and not self._may_start()

    def _take(self) -> tuple[Group, ...]:
        due = set(self._due())
        taken = take_order(self._finished.values(), due)[: self.options.groups_per_step]
        for group in taken:
            del self._finished[group.index]
        return tuple(taken)

    def _startable(self) -> list[tuple[int, int]]:
        """Groups to start now (their numbers and the relative version), under the lock."""
        out: list[tuple[int, int]] = []
        while (
            not self._closing
            and self._error is None
            and self._episodes + self.options.num_generations <= self.options.inflight
            and self._may_start()
        ):
            if self._requeue:
                index = self._requeue.popleft()
            else:
                index, self._next_index = self._next_index, self._next_index + 1
            self._started += 1
            self._playing[index] = self._published
            self._window.change(self._episodes, self._episodes + self.options.num_generations)
            self._episodes += self.options.num_generations
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
        with self._cond:
            self._members[index] = [None] * self.options.num_generations
            self._began[index] = time.monotonic()
        seed = self.options.seed
        tasks = [
            asyncio.ensure_future(
                self._play_member(
                    index,
                    RolloutRequest(
                        row=row,
                        repeat_index=i,
                        seed=None if seed is None else rollout_seed(seed, index, i),
                    ),
                )
            )
            for i in range(self.options.num_generations)
        ]
        with self._cond:
            self._member_tasks[index] = tasks
        try:
            await asyncio.wait(tasks)
        except asyncio.CancelledError:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise
        failed = next(
            (t.exception() for t in tasks if not t.cancelled() and t.exception() is not None),
            None,
        )
        with self._cond:
            if failed is not None:  # handed to the learner by next_step
                self._error = self._error or failed
                if self._playing.pop(index, None) is not None:
                    self._requeue.appendleft(index)  # not lost: close() lists it
                self._forget_members(index)
            elif index in self._playing:  # not cut while it played
                self._finalize(index)
            self._cond.notify_all()
        assert self._wake is not None
        self._wake.set()

    async def _play_member(self, index: int, request: RolloutRequest) -> None:
        rollout = await self._play_one(request)
        with self._cond:
            members = self._members.get(index)
            if members is not None:
                members[request.repeat_index] = rollout
                if self.options.cut_stragglers:
                    self._cond.notify_all()  # the learner may cut the group now

    def _finalize(self, index: int, *, cut: str | None = None) -> None:
        """Move a playing group to the finished ones (under the lock); ``cut`` says why its
        missing episodes end as ``TIMEOUT`` failures (they are cancelled)."""
        members = self._members[index]
        row = self.rows[index % len(self.rows)]
        rollouts = []
        for repeat, rollout in enumerate(members):
            if rollout is None:
                failed = Rollout.failed(RolloutStatus.TIMEOUT, self.eos_token_id, error=cut)
                rollout = stamp(failed, row_id=row.row_id, repeat_index=repeat)
                self._window.cut += 1
            rollouts.append(rollout)
        self._finished[index] = Group(
            index=index,
            row=row,
            started_on=self._playing.pop(index),
            rollouts=tuple(rollouts),
            seconds=time.monotonic() - self._began[index],
        )
        tasks = self._member_tasks.get(index, [])
        self._forget_members(index)
        if cut is not None and self._loop is not None:
            self._loop.loop.call_soon_threadsafe(lambda: [t.cancel() for t in tasks])

    def _forget_members(self, index: int) -> None:
        self._members.pop(index, None)
        self._member_tasks.pop(index, None)
        self._began.pop(index, None)

    def _cut_stragglers(self, due: list[int]) -> None:
        """``cut_stragglers``: a due group still playing, with at least two ``OK`` episodes
        done, is handed out now; its other episodes end as ``TIMEOUT`` failures."""
        if not self.options.cut_stragglers:
            return
        for index in due:
            members = self._members.get(index)
            done_ok = sum(1 for r in members or () if r is not None and r.ok)
            if index in self._playing and members is not None and done_ok >= 2:
                reason = (
                    f"cut: still playing when its group was due at step {self._steps} "
                    "(cut_stragglers)"
                )
                self._finalize(index, cut=reason)

    async def _play_one(self, request: RolloutRequest) -> Rollout:
        try:
            return await self.client.play(
                request,
                eos_token_id=self.eos_token_id,
                parse=self.options.parse,
                timeout=self.options.episode_timeout,
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
