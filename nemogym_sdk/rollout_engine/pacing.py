"""The rules ``RolloutEngine`` paces by: pure functions of counters, no network, no asyncio.

- ``may_start``: may another group start, with so many started and so many versions
  published?
- ``is_due``: must this step include a group that started on that version?
- ``take_order``: the order a step takes finished groups in (the due ones first, then the
  oldest).
- ``keeps_bound``: may a step take these groups now, or would a later step then find more
  groups due than it can take (so that one would be trained too late)?

Being pure, a simulation runs the engine's exact schedule with them
(``benchmarks/sim_async.py``); the module doc of ``nemogym_sdk.rollout_engine.engine`` says
why they bound staleness.
"""

from __future__ import annotations

import collections
from collections.abc import Collection, Iterable

from nemogym_sdk.rollout_engine.groups import Group

__all__ = ["is_due", "keeps_bound", "may_start", "take_order"]


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


def keeps_bound(
    taken: Iterable[int],
    untrained: Iterable[int],
    step: int,
    max_staleness: int,
    groups_per_step: int,
) -> bool:
    """Whether step ``step`` may take groups started on the versions ``taken`` (out of
    ``untrained``: the versions every started, untrained group started on, the taken ones
    included) and every later step ``j`` still find no more groups due than the
    ``(j - step) * groups_per_step`` it and the steps before it can take.

    With ``max_staleness`` of 2 or more a step has room for fresher groups than the due
    ones; taking a fresher finished group while older ones still play leaves those older
    ones to later steps, which may then hold more due groups than they can take, and one
    would be trained more than ``max_staleness`` versions late. A step whose groups fail
    this waits for an older group to finish instead."""
    left = collections.Counter(untrained)
    left.subtract(collections.Counter(taken))
    versions = sorted(left.elements())
    if not versions:
        return True
    for j in range(step + 1, versions[-1] + max_staleness + 1):
        due = sum(1 for v in versions if is_due(v, j, max_staleness))
        if due > (j - step) * groups_per_step:
            return False
    return True
