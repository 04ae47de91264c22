"""The one start recipe for a server process: spawn it, wait until it answers, and stop it
if anything goes wrong before it is handed over.

    process = start_server("vllm", argv, log_path=log, health_url=url, ready_timeout=180)

``start_serve``, ``start_vllm`` and ``start_router`` (``nemogym_sdk.samplers``) start
through it; ``stopping_on_error`` is the same guarantee for work done after the process
answers (``start_serve`` asks its model's name, ``GymLauncher`` reads the head server).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

from nemogym_sdk.processes.process import ServerProcess, spawn, stop_all, wait_ready

__all__ = ["default_log_path", "start_server", "stopping_on_error"]


def start_server(
    name: str,
    argv: Sequence[str],
    *,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    log_path: Path,
    health_url: str,
    ready_timeout: float,
    grace: float = 5.0,
    preload: Sequence[str] = (),
) -> ServerProcess:
    """Start ``argv`` (see ``spawn``) and wait until ``health_url`` answers 2xx.

    Args:
        name: the server's name in logs and errors.
        argv: its command line.
        cwd: where it runs (default the current directory).
        env: its whole environment (default this process's).
        log_path: the file its stdout and stderr go to.
        health_url: polled until it answers 2xx.
        ready_timeout: seconds to wait for that answer.
        grace: seconds between SIGTERM and SIGKILL when it must be stopped.
        preload: modules to import once in a fork server and fork it from (see ``spawn``).

    Raises ``ServerStartError`` (the log's tail included) if it exits, ``ServerNotReadyError``
    if it does not answer in time. Whatever interrupts the wait (those, a
    ``KeyboardInterrupt`` ...), the process group is stopped before it propagates.
    """
    process = spawn(
        name,
        argv,
        cwd=cwd if cwd is not None else Path.cwd(),
        env=env if env is not None else os.environ,
        log_path=log_path,
        health_url=health_url,
        preload=preload,
    )
    with stopping_on_error(process, grace=grace):
        wait_ready([process], ready_timeout)
    return process


@contextlib.contextmanager
def stopping_on_error(
    process: ServerProcess,
    *,
    grace: float = 5.0,
    stop: Callable[[], None] | None = None,
) -> Iterator[ServerProcess]:
    """Run the block; if anything escapes it (``KeyboardInterrupt`` included), stop
    ``process`` first (``stop()`` if given, else its group with ``grace``), then re-raise."""
    try:
        yield process
    except BaseException:
        if stop is not None:
            stop()
        else:
            stop_all([process], grace)
        raise


def default_log_path(kind: str, port: int) -> Path:
    """``<tmp>/nemogym-<kind>-<port>-<pid>.log``: a server's log when the caller names none."""
    return Path(tempfile.gettempdir()) / f"nemogym-{kind}-{port}-{os.getpid()}.log"
