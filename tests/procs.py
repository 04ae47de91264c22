"""Whether the processes a test started are gone (psutil; zombies count as gone)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sized

import psutil


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, dead but not yet reaped, does not)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def gone_within(left: Callable[[], Sized | bool], seconds: float) -> float:
    """Seconds until ``left()`` is empty (or false); fails with what is left after
    ``seconds``."""
    began = time.monotonic()
    while remaining := left():
        assert time.monotonic() - began < seconds, remaining
        time.sleep(0.1)
    return time.monotonic() - began
