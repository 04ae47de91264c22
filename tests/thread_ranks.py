"""Ranks as threads: a real ``gather`` hook for ``compute_advantages`` without torch.

Each "rank" runs in its own thread and gets a hook that hands its array to the others and
waits (``threading.Barrier``) until every rank has done the same, exactly the contract of
``nemogym_sdk.grpo.Gather``. A rank that skipped a gather, or called one more, would leave
the others waiting: the barrier's timeout turns that into ``BrokenBarrierError``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from nemogym_sdk.grpo import Gather


def run_ranks(bodies: Sequence[Callable[[Gather], Any]], timeout: float = 20.0) -> list[Any]:
    """Run ``bodies[r](gather_r)`` for every rank ``r`` at once; returns each one's result,
    or the exception it raised."""
    ranks = len(bodies)
    barrier = threading.Barrier(ranks, timeout=timeout)
    slots: list[np.ndarray[Any, np.dtype[np.float64]]] = [np.zeros(0)] * ranks
    results: list[Any] = [None] * ranks

    def hook(rank: int) -> Gather:
        def gather(values: np.ndarray[Any, np.dtype[np.float64]]) -> Any:
            slots[rank] = np.array(values, dtype=np.float64, copy=True)
            barrier.wait()
            out = np.concatenate(slots)
            barrier.wait()  # nobody overwrites a slot before every rank has read them all
            return out

        return gather

    def body(rank: int) -> None:
        try:
            results[rank] = bodies[rank](hook(rank))
        except BaseException as exc:  # noqa: BLE001 - handed back to the test
            results[rank] = exc

    threads = [threading.Thread(target=body, args=(rank,)) for rank in range(ranks)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout + 5.0)
    assert not any(thread.is_alive() for thread in threads), "a rank never returned"
    return results
