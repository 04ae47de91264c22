"""Nothing the SDK starts outlives the process that started it, however that process ends.

The servers are stopped by their owner (``stop_all``, ``atexit``) when it ends normally or
on a signal it handles. SIGKILL (a supervisor's grace period ending, the OOM killer,
``kill -9``) runs no handler, and each server leads a process group of its own, so nothing
else would stop them. So the first ``spawn`` of a process also starts a watchdog: a small
process (stdlib only, ``_watchdog_main.py``) in a session of its own, holding the read end
of a pipe whose write end only the owner has. ``spawn`` tells it each process group it
starts (``watch``), ``stop_all`` each one it has stopped (``unwatch``).

When the owner dies, the kernel closes its end of the pipe. The watchdog then signals every
group still watched: SIGTERM to the group, or what ``watch`` asked for (NeMo Gym's launcher
gets SIGINT on its own, as ``GymLauncher.stop`` sends, and stops its servers and Ray). It
waits up to the group's grace, SIGKILLs what is left of each group, and says so in one line
on stderr. A process the owner forked without ``exec`` keeps the pipe open; the watchdog
also notices that its parent is no longer the owner (checked twice a second).

A process group holds its leader and everything the leader starts without leaving the
group: vLLM's engine core, NeMo Gym's servers under ``gym env start``, Ray's processes.
Linux's parent-death signal covers only direct children, and only while the thread that
started them lives, which is why the SDK does not use it.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

__all__ = ["unwatch", "watch", "watchdog_pid"]

_MAIN = Path(__file__).with_name("_watchdog_main.py")
_EXIT_WAIT_S = 30.0
"""At a normal exit, how long the owner waits for its watchdog to stop what is left."""


class _Watchdog:
    """The owner's side: the watchdog process and the write end of its pipe."""

    def __init__(self) -> None:
        self.owner = os.getpid()
        read, self._write = os.pipe()  # neither end is inherited by other children
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-I", str(_MAIN), str(self.owner)],
                stdin=read,
                stdout=subprocess.DEVNULL,
                cwd="/",
                start_new_session=True,  # a terminal's Ctrl-C is for the owner, not for it
            )
        finally:
            os.close(read)
        self._lock = threading.Lock()

    def send(self, line: str) -> None:
        with self._lock:
            if self._write < 0:
                return
            with contextlib.suppress(OSError):  # the watchdog is gone: nothing to tell
                os.write(self._write, line.encode())

    def close(self) -> None:
        """End the pipe (a normal exit): the watchdog stops what is still watched, exits."""
        with self._lock:
            if self._write < 0:
                return
            os.close(self._write)
            self._write = -1
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=_EXIT_WAIT_S)


_watchdog: _Watchdog | None = None
_lock = threading.Lock()


def _current() -> _Watchdog:
    global _watchdog
    with _lock:
        if _watchdog is None or _watchdog.owner != os.getpid():  # first use, or a fork
            _watchdog = _Watchdog()
        return _watchdog


def _close_at_exit() -> None:
    watchdog = _watchdog
    if watchdog is not None and watchdog.owner == os.getpid():
        watchdog.close()


# registered when the SDK's process room is imported, before any server registers its own
# stop: ``atexit`` runs the servers' stops first, then this (what is left, it stops)
atexit.register(_close_at_exit)


def watch(
    pgid: int,
    *,
    first_signal: int = signal.SIGTERM,
    leader_only: bool = False,
    grace: float = 5.0,
) -> None:
    """Have the watchdog stop process group ``pgid`` if this process dies first: send
    ``first_signal`` to the group (or to its leader only, which then stops the rest its own
    way), wait up to ``grace`` seconds, then SIGKILL the group. Watching a group again
    replaces how."""
    to = "leader" if leader_only else "group"
    _current().send(f"watch {pgid} {int(first_signal)} {grace} {to}\n")


def unwatch(pgid: int) -> None:
    """Process group ``pgid`` has been stopped (or handed over): forget it."""
    watchdog = _watchdog
    if watchdog is not None and watchdog.owner == os.getpid():
        watchdog.send(f"unwatch {pgid}\n")


def watchdog_pid() -> int | None:
    """This process's watchdog, if it has started one (for tests and diagnostics)."""
    watchdog = _watchdog
    if watchdog is None or watchdog.owner != os.getpid():
        return None
    return watchdog.process.pid
