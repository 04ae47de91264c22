"""One process at a time: an exclusive ``flock`` on a lock file (POSIX; stdlib only).

Builders of a shared cache (a NeMo Gym server's venv, a family's model) hold it while they
build, so a second builder waits and then uses what the first made instead of building it
again.
"""

from __future__ import annotations

import contextlib
import fcntl
from collections.abc import Callable, Iterator
from pathlib import Path

__all__ = ["exclusive"]


@contextlib.contextmanager
def exclusive(lock_path: Path, *, on_wait: Callable[[], None] | None = None) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``lock_path`` (the kernel releases it if the process
    dies); ``on_wait`` is called once when another holder makes this one wait. Each call
    opens the file anew, so two threads of one process exclude each other too."""
    with lock_path.open("a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if on_wait is not None:
                on_wait()
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
