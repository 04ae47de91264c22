"""How ``nemogym-train`` gets each step's rollouts: ``--mode sync`` or ``--mode async``.

* ``sync`` (the default): play the step's groups, wait for the slowest episode, learn,
  sync the adapter, repeat; ``--prefetch`` plays step k+1 while step k learns.
* ``async``: a ``RolloutEngine`` keeps episodes playing while the learner learns, within
  ``--max-staleness K`` adapter versions (pacing, never discarding), each episode under
  ``--episode-timeout``; every published version lets more groups start. A checkpoint
  records the groups started but not yet trained, and ``--resume`` plays them first
  (re-queued); at the end of a run the episodes still playing are cancelled and counted.
  Under torchrun rank 0 plays and every rank trains its share of each step's groups.

Both number groups the same way (group ``n`` plays ``rows[n % len(rows)]``; step ``s`` of the
synchronous schedule plays groups ``s * rows_per_step`` onwards), and both hand the learner
whole groups of this rank.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import time
from collections.abc import Generator, Iterator, Mapping, Sequence
from typing import Any, NamedTuple, Protocol

from nemogym_sdk import AgentClient, Rollout, RolloutEngine, RolloutRequest, TaskRow, ranks
from nemogym_sdk.data import rollout_seed
from nemogym_sdk.train.config import TrainConfig

__all__ = ["Played", "RolloutSource", "play", "rows_for_step"]

logger = logging.getLogger(__name__)


class Played(NamedTuple):
    """One step's rollouts and what getting them cost."""

    rollouts: list[Rollout]
    waited_s: float
    """Seconds the learner waited for them."""
    metrics: dict[str, float]
    """The rollout side's own step metrics (the engine's, in async mode)."""
    groups: list[tuple[int, str]]
    """The step's groups, every rank's: (group number, row id), in training order."""


class RolloutSource(Protocol):
    """What ``play()`` yields: the learner's side of the rollouts, in either mode."""

    def steps(self) -> Iterator[Played]:
        """Each step's rollouts (whole groups of this rank), in order, without end."""
        ...

    def published(self, version: int | None) -> None:
        """The learner published adapter ``version`` (async: more groups may start)."""
        ...

    def state(self) -> dict[str, Any]:
        """What a checkpoint records of it (async: the groups started, not yet trained)."""
        ...


def rows_for_step(rows: Sequence[TaskRow], step: int, config: TrainConfig) -> list[TaskRow]:
    """The step's rows (``rows_per_step`` groups, cycling through the file)."""
    start = (step * config.rows_per_step) % len(rows)
    return [rows[(start + i) % len(rows)] for i in range(config.rows_per_step)]


class _Sync:
    def __init__(
        self,
        client: AgentClient,
        rows: Sequence[TaskRow],
        config: TrainConfig,
        start: int,
        eos: int,
    ) -> None:
        self._steps = _sync_steps(client, rows, config, start, eos)
        self._rows, self._config, self._start = rows, config, start

    def steps(self) -> Iterator[Played]:
        for step, (rollouts, waited) in enumerate(self._steps, self._start):
            first = step * self._config.rows_per_step
            played = rows_for_step(self._rows, step, self._config)
            groups = [(first + i, row.row_id) for i, row in enumerate(played)]
            yield Played(rollouts, waited, {}, groups)

    def published(self, version: int | None) -> None:
        return None

    def state(self) -> dict[str, Any]:
        return {}

    def close(self) -> dict[str, Any]:
        self._steps.close()
        return {}


def _sync_steps(
    client: AgentClient, rows: Sequence[TaskRow], config: TrainConfig, start: int, eos: int
) -> Generator[tuple[list[Rollout], float], None, None]:
    """Each step's rollouts, this rank's whole groups, and the seconds waited for them; with
    ``prefetch`` step k+1's are played while step k trains (one adapter version stale)."""
    rank, world = ranks.rank(), ranks.world_size()
    parse = config.engine_options().parse

    def run(step: int) -> list[Rollout]:
        first = step * config.rows_per_step
        played = rows_for_step(rows, step, config)
        requests = [
            RolloutRequest(row=row, repeat_index=i, seed=_seed(config, first + group, i))
            for group, row in enumerate(played)
            if group % world == rank  # this rank's groups
            for i in range(config.num_generations)
        ]
        return client.run_sync(requests, eos_token_id=eos, parse=parse)

    pool = concurrent.futures.ThreadPoolExecutor(1)
    try:
        pending = pool.submit(run, start) if config.prefetch else None
        for step in range(start, config.steps):
            began = time.perf_counter()
            if pending is not None:
                played = pending.result()
                pending = pool.submit(run, step + 1) if step + 1 < config.steps else None
            else:
                played = run(step)
            yield played, time.perf_counter() - began
    finally:
        # a run stopped early does not wait for the step being prefetched: closing the
        # client cancels its episodes
        pool.shutdown(wait=False, cancel_futures=True)


def _seed(config: TrainConfig, group: int, index: int) -> int | None:
    """Rollout ``index`` of group ``group``'s sampling seed, or None (``rollouts_seed``)."""
    seed = config.rollouts_seed
    return None if seed is None else rollout_seed(seed, group, index)


class _Async:
    """Rank 0 owns the engine: it plays, paces and hears every publish. Each step it hands
    out is broadcast to every rank, which trains its share of the groups (the ones at
    positions ``rank, rank + world, ...`` of the step's training order, as in sync mode)."""

    def __init__(
        self,
        client: AgentClient,
        rows: Sequence[TaskRow],
        config: TrainConfig,
        start: int,
        eos: int,
        resumed: Mapping[str, Any],
        capacity: int | None = None,
    ) -> None:
        self._config, self._start = config, start
        self.engine: RolloutEngine | None = None
        if ranks.rank() != 0:
            return
        requeue = resumed.get("requeue", ())
        options = config.engine_options(capacity)
        if config.max_inflight is None and options.max_inflight is not None:
            logger.info(
                "async: at most %s episodes in flight: the sampler decodes %s at once",
                options.max_inflight,
                capacity,
            )
        self.engine = RolloutEngine(
            client,
            rows,
            options,
            eos_token_id=eos,
            requeue=requeue,
            next_index=int(resumed.get("next_index", start * config.rows_per_step)),
        ).start()
        if requeue:
            logger.info("resumed: playing the %d group(s) the checkpoint left first", len(requeue))

    def _next_step(
        self,
    ) -> tuple[list[tuple[Rollout, ...]], float, dict[str, float], list[tuple[int, str]]]:
        """Rank 0: the engine's next step, as plain records every rank can receive."""
        assert self.engine is not None  # rank 0 only (ranks.on_main)
        step = self.engine.next_step()
        groups = [(group.index, group.row.row_id) for group in step.groups]
        return [group.rollouts for group in step.groups], step.waited_s, step.metrics(), groups

    def steps(self) -> Iterator[Played]:
        rank, world = ranks.rank(), ranks.world_size()
        for _ in range(self._start, self._config.steps):
            members, waited, metrics, groups = ranks.on_main(self._next_step)
            mine = [rollout for group in members[rank::world] for rollout in group]
            yield Played(mine, waited, metrics, groups)

    def published(self, version: int | None) -> None:
        if self.engine is not None:
            self.engine.publish(version)

    def state(self) -> dict[str, Any]:
        if self.engine is None:  # only rank 0 writes checkpoints
            return {}
        requeue, next_index = self.engine.pending()
        return {"requeue": list(requeue), "next_index": next_index}

    def close(self) -> dict[str, Any]:
        if self.engine is None:
            return {}
        left = self.engine.close()
        return {
            "untrained_groups": list(left.requeue),
            "finished_untrained_groups": len(left.finished),
            "cancelled_episodes": left.cancelled,
            "next_index": left.next_index,
        }


@contextlib.contextmanager
def play(
    config: TrainConfig,
    client: AgentClient,
    rows: Sequence[TaskRow],
    start: int,
    eos: int,
    resumed: Mapping[str, Any],
    leftover: dict[str, Any],
    capacity: int | None = None,
) -> Iterator[RolloutSource]:
    """The rollout side of a run in ``config.mode``; ``leftover`` receives what it left
    untrained when the run ends (async mode: groups in flight, cancelled and counted);
    ``capacity``: how many generations the sampler decodes at once (async mode starts no
    more episodes, `TrainConfig.engine_options`)."""
    source: _Sync | _Async = (
        _Async(client, rows, config, start, eos, resumed, capacity)
        if config.mode == "async"
        else _Sync(client, rows, config, start, eos)
    )
    try:
        yield source
    finally:
        leftover.update(source.close())
