"""Several processes, one outcome: the main process acts, every rank learns the result.

A trainer under ``torchrun`` (or accelerate) has one process that talks to the servers (it
publishes the adapter, discovers the deployment, starts the sampler) and others that must
not. ``on_main`` is the one way the SDK does that: the main process runs the action, and
the result, or the error, reaches every rank through a broadcast, so no rank waits forever
for one that gave up, and all of them fail together with the same exception.
``share`` and ``gather`` are the two plain collectives the SDK's trainers need besides.

Without ``torch.distributed`` (or before its process group is up) each function is the
single-process case. torch is never imported here: a process group can only exist in a
process that already imported it, so it is looked up in ``sys.modules``.
"""

from __future__ import annotations

import pickle
import sys
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["distributed", "gather", "on_main", "rank", "share", "world_size"]

T = TypeVar("T")


def distributed() -> Any:
    """``torch.distributed`` when torch is imported and a process group is up, else None."""
    torch = sys.modules.get("torch")
    dist = getattr(torch, "distributed", None)
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return None
    return dist


def rank() -> int:
    """This process's rank (0 without a process group)."""
    dist = distributed()
    return 0 if dist is None else int(dist.get_rank())


def world_size() -> int:
    """How many processes there are (1 without a process group)."""
    dist = distributed()
    return 1 if dist is None else int(dist.get_world_size())


def share(value: T) -> T:
    """Rank 0's ``value`` on every rank (pickled; every rank must call it)."""
    dist = distributed()
    if dist is None:
        return value
    box: list[Any] = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]  # type: ignore[no-any-return]


def gather(value: T) -> list[T]:
    """Every rank's ``value``, in rank order, on every rank (pickled)."""
    dist = distributed()
    if dist is None:
        return [value]
    values: list[Any] = [None] * int(dist.get_world_size())
    dist.all_gather_object(values, value)
    return values


def on_main(action: Callable[[], T], *, is_main: bool | None = None) -> T:
    """Run ``action`` on the main process only; every rank returns its result.

    ``is_main`` defaults to rank 0 (``trainer.accelerator.is_main_process`` and
    ``state.is_world_process_zero`` say the same under accelerate). With a process group
    up, rank 0's outcome is broadcast: the result (which must pickle) is returned on every
    rank, and an exception is raised on every rank, the original on the main process and
    an unpickled copy elsewhere (the SDK's errors pickle; another exception reaches the
    other ranks as a ``RuntimeError`` naming it). Every rank must call it.
    """
    dist = distributed()
    if is_main is None:
        is_main = dist is None or int(dist.get_rank()) == 0
    result: Any = None
    error: BaseException | None = None
    if is_main:
        try:
            result = action()
            if dist is not None:  # fail here, not inside the broadcast the others wait on
                pickle.dumps(result)
        except Exception as exc:  # noqa: BLE001 - re-raised below, after the other ranks know
            error = exc
    if dist is not None:
        outcome = share((None, _portable(error)) if error is not None else (result, None))
        if error is None and outcome[1] is not None:
            raise outcome[1]
        result = outcome[0]
    if error is not None:
        raise error
    return result  # type: ignore[no-any-return]


def _portable(error: BaseException) -> BaseException:
    """``error`` if it survives pickling, else a ``RuntimeError`` saying what it was."""
    try:
        pickle.loads(pickle.dumps(error))
    except Exception:  # noqa: BLE001 - any failure to round-trip means "send a summary"
        return RuntimeError(f"the main process failed: {type(error).__name__}: {error}")
    return error
