"""The rules ``RolloutEngine`` paces by: pure functions of counters, no network, no asyncio.

- ``may_start``: may another group start, with so many started and so many versions
  published?
- ``is_due``: must this step include a group that started on that version?
- ``take_order``: the order a step takes finished groups in (the due ones first, then the
  oldest).

Being pure, a simulation runs the engine's exact schedule with them
(``benchmarks/sim_async.py``); the module doc of ``nemogym_sdk.rollout_engine.engine`` says
why they bound staleness.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable

from nemogym_sdk.rollout_engine.groups import Group

__all__ = ["is_due", "may_start", "take_order"]


def may_start(started: int, published: int, max_staleness: int, groups_per_step: int) -> bool:
    """The pacing rule: with ``started`` groups started and ``published`` versions published
    since the start, may another group start?"""
    return started < (published + max_staleness + 1) * groups_per_step


def is_due(started_on: int, step: int, max_staleness: int) -> bool:
    """Must step ``step`` include a group that started after ``started_on`` publishes?"""
    return started_on <= step - max_staleness


def take_order(finished: Iterable[Group], due: Collection[int]) -> list[Group]:
    """``finished`` in the order a step takes them: the groups in ``due`` first, then by the
    version they started on, then by number."""
    return sorted(finished, key=lambda g: (g.index not in due, g.started_on, g.index))
