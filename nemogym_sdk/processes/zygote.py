"""This process as its own fork server: forked while it runs one thread and holds the
imports a server it starts later needs, instead of a new interpreter importing them again.

``nemogym-train`` imports torch, transformers and peft before its first step, and the
``nemogym_sdk.serve`` sampler it starts imports them again (~4 s of CPU). At the start of
its main, before any thread, log file or server of its own, `fork_this_process` forks it
into a fork server (the loop of ``_forkserver_main.py``, as a new interpreter runs it)
registered under the key ``start_serve(fork=True)`` looks up; the sampler is then forked
from it. Where the environment changed in between, the key differs and
`fork_server <nemogym_sdk.processes.forkserver.fork_server>` starts a new interpreter as
before.

The forked copy keeps nothing of this process but its imports: stdin and stdout are the
pipes to it, stderr a file of its own, every other descriptor is closed, the stop signals
start from their defaults, and the servers it forks run as from any fork server.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from typing import IO

from nemogym_sdk.processes.forkserver import (
    _MAIN,
    ForkServerError,
    fork_server,
    fork_servers_enabled,
)

__all__ = ["fork_this_process"]

_STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)


class _Forked:
    """What `ForkServer` uses of a ``subprocess.Popen``, for this process's forked copy."""

    def __init__(self, pid: int, stdin: IO[bytes], stdout: IO[bytes]) -> None:
        self.pid = pid
        self.stdin: IO[bytes] | None = stdin
        self.stdout: IO[bytes] | None = stdout
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped elsewhere: gone all the same
                self.returncode = -1
            else:
                if pid:
                    self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"fork server {self.pid}", timeout or 0.0)
            time.sleep(0.01)
        return code

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)


def _start(preload: Sequence[str]) -> Callable[[IO[bytes]], _Forked]:
    """``ForkServer``'s ``start``: fork this process into one that runs the fork server's
    loop with stderr to ``log``; in this process, its handle."""

    def start(log: IO[bytes]) -> _Forked:
        requests_in, requests_out = os.pipe()
        replies_in, replies_out = os.pipe()
        for stream in (sys.stdout, sys.stderr):  # nothing of this process's output twice
            with contextlib.suppress(Exception):
                stream.flush()
        pid = os.fork()
        if pid == 0:  # the copy: a fork server
            code = 1
            try:
                os.dup2(requests_in, 0)
                os.dup2(replies_out, 1)
                os.dup2(log.fileno(), 2)
                os.closerange(3, os.sysconf("SC_OPEN_MAX"))
                sys.stdin = open(0, closefd=False)  # noqa: SIM115 -- the process's own
                sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115
                sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
                for sig in _STOP_SIGNALS:
                    signal.signal(sig, signal.SIG_DFL)
                spec = importlib.util.spec_from_file_location("_nemogym_forkserver_main", _MAIN)
                assert spec is not None and spec.loader is not None
                loop = importlib.util.module_from_spec(spec)
                spec.loader.exec_module(loop)
                code = int(loop.main(list(preload)))
            except BaseException:  # noqa: BLE001 -- said in its log; the owner sees it end
                traceback.print_exc()
            finally:
                os._exit(code)
        os.close(requests_in)
        os.close(replies_out)
        return _Forked(pid, os.fdopen(requests_out, "wb"), os.fdopen(replies_in, "rb"))

    return start


def fork_this_process(preload: Sequence[str], env: Mapping[str, str]) -> bool:
    """Fork this process into its fork server for ``sys.executable`` with ``preload``
    imported under ``env`` (`fork_server`'s key), where it can: fork servers on
    (``NEMOGYM_FORK_SERVERS``), ``preload`` importable here, no thread but the main one
    running (a thread's locks would be copied held). False where it did not."""
    if not fork_servers_enabled() or threading.active_count() > 1:
        return False
    try:
        for name in preload:
            importlib.import_module(name)
    except ImportError:
        return False
    try:
        fork_server(sys.executable, tuple(preload), env, start=_start(preload))
    except ForkServerError:  # said in its log; a server then starts as it would without
        return False
    return True
