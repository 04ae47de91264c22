"""Server processes: start with a log file and a process group of their own, wait, stop.

``spawn`` starts one, ``wait_ready`` polls until it answers, ``stop_all`` ends process
groups, ``tail`` quotes a log; ``ProcessGroup`` does the same for the servers of one stack.
Every process is started with ``start_new_session=True``, so it leads a process group
that holds it and anything it spawns. Stopping sends SIGTERM to the group, waits a
grace period, then SIGKILLs whatever is left of the group. Nothing is ever killed by
name, only by the group ids this module created. If this process dies without stopping a
group (SIGKILL), its watchdog does (``nemogym_sdk.processes.watchdog``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Protocol, Self

import attrs
import requests

from nemogym_sdk._net.ready import answered, poll_ready
from nemogym_sdk.processes.errors import ServerNotReadyError, ServerStartError
from nemogym_sdk.processes.forkserver import fork_server, fork_servers_enabled, forkable
from nemogym_sdk.processes.watchdog import unwatch, watch

__all__ = [
    "Child",
    "ProcessGroup",
    "ProcessSpec",
    "ServerProcess",
    "StopOnExit",
    "group_alive",
    "spawn",
    "stop_all",
    "tail",
    "wait_answering",
    "wait_ready",
]

logger = logging.getLogger(__name__)

_POLL_INTERVAL_S = 0.1
TAIL_LINES = 40
"""How many log lines a start-up error quotes."""


class Child(Protocol):
    """What the SDK uses of a started process: ``subprocess.Popen``'s ``pid``, ``poll`` and
    ``wait`` (`ForkedChild` has them too)."""

    @property
    def pid(self) -> int: ...

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...


@attrs.define(kw_only=True, eq=False)
class ServerProcess:
    """A started server process, the leader of its own process group."""

    name: str
    """Instance name of the server (or ``head_server``)."""
    popen: Child
    """The process (its pid is also its process-group id): a ``subprocess.Popen``, or a
    `ForkedChild` when a fork server started it."""
    log_path: Path
    """File receiving its stdout and stderr."""
    health_url: str
    """URL polled until it answers 200."""
    stopped: bool = False
    """Set once the leader is reaped and its group is empty; it is never signalled again
    (its pid, and so its group id, may be reused by an unrelated process)."""

    @property
    def pid(self) -> int:
        """Process id, which is also the process-group id."""
        return self.popen.pid

    def tail(self, lines: int = TAIL_LINES) -> str:
        """The last ``lines`` lines of the log."""
        return tail(self.log_path, lines)


class StopOnExit:
    """``with`` support for a started server object: ``stop()`` on exit (of the block or,
    through ``atexit`` elsewhere, of the interpreter). Subclasses define ``stop``."""

    __slots__ = ()

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()


@attrs.frozen(kw_only=True)
class ProcessSpec:
    """How to start one server process: what :func:`spawn` takes."""

    name: str
    """Instance name of the server (or ``head_server``)."""
    argv: tuple[str, ...]
    """Command line; ``argv[0]`` is the interpreter."""
    cwd: Path
    """Directory it runs in."""
    env: Mapping[str, str] = attrs.field(repr=False)
    """Its whole environment."""
    log_path: Path
    """File receiving its stdout and stderr."""
    health_url: str
    """URL polled until it answers 2xx."""
    preload: tuple[str, ...] = ()
    """Modules to import once in a fork server for ``argv[0]`` and fork this process from
    (see `nemogym_sdk.processes.forkserver`); empty: a new interpreter."""


class ProcessGroup:
    """The processes of one stack, each the leader of its own process group.

    :meth:`spawn` starts them one by one, :meth:`wait_ready` waits for all, :meth:`stop`
    ends them (last started first) by their process groups, never by name.
    """

    def __init__(self) -> None:
        self._processes: list[ServerProcess] = []

    def spawn(self, spec: ProcessSpec) -> ServerProcess:
        """Start ``spec`` (see :func:`spawn`) and keep it in the group."""
        process = spawn(
            spec.name,
            spec.argv,
            cwd=spec.cwd,
            env=spec.env,
            log_path=spec.log_path,
            health_url=spec.health_url,
            preload=spec.preload,
        )
        self._processes.append(process)
        return process

    def wait_ready(self, timeout: float) -> None:
        """Wait until every process answers (see :func:`wait_ready`)."""
        wait_ready(self._processes, timeout)

    def stop(self, grace: float) -> None:
        """SIGTERM, then SIGKILL after ``grace``, every group, last started first."""
        stop_all(list(reversed(self._processes)), grace)

    def __len__(self) -> int:
        return len(self._processes)

    @property
    def log_paths(self) -> dict[str, Path]:
        """Process name -> log file."""
        return {p.name: p.log_path for p in self._processes}

    @property
    def pids(self) -> dict[str, int]:
        """Process name -> pid, which is also its process-group id."""
        return {p.name: p.pid for p in self._processes}


def tail(path: Path, lines: int = TAIL_LINES) -> str:
    """The last ``lines`` lines of a text file ("" if it does not exist)."""
    try:
        with path.open("rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - 64 * 1024))
            data = handle.read()
    except FileNotFoundError:
        return ""
    text = data.decode("utf-8", errors="replace")
    return "\n".join(text.splitlines()[-lines:])


def spawn(
    name: str,
    argv: Sequence[str],
    *,
    cwd: Path,
    env: Mapping[str, str],
    log_path: Path,
    health_url: str,
    preload: Sequence[str] = (),
) -> ServerProcess:
    """Start ``argv`` in ``cwd`` as a new session, stdout and stderr appended to ``log_path``.

    With ``preload`` (modules) and ``argv`` of the form ``python [-P] script [args]`` or
    ``python -m module [args]``, it is forked from this process's fork server for that
    interpreter, which imported them once (`nemogym_sdk.processes.forkserver`;
    ``NEMOGYM_FORK_SERVERS=0`` turns that off).

    The watchdog (``nemogym_sdk.processes.watchdog``) stops its group if this process dies
    without stopping it: SIGTERM, then SIGKILL 5 s later (``watch`` again to change that).
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    forked = bool(preload) and fork_servers_enabled() and forkable(argv)
    with log_path.open("ab") as log:
        how = f" (forked, {', '.join(preload)} imported)" if forked else ""
        log.write(f"# {name}: argv={list(argv)!r} cwd={str(cwd)!r}{how}\n".encode())
        log.flush()
        popen: Child
        if forked:
            server = fork_server(argv[0], tuple(preload), env)
            popen = server.fork(argv, cwd=cwd, env=env, log_path=log_path)
        else:
            popen = subprocess.Popen(
                list(argv),
                cwd=cwd,
                env=dict(env),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
    watch(popen.pid)
    logger.debug("started %s (pid %d), log %s", name, popen.pid, log_path)
    return ServerProcess(name=name, popen=popen, log_path=log_path, health_url=health_url)


def wait_ready(processes: Sequence[ServerProcess], timeout: float) -> None:
    """Poll every process's health URL until all answer 2xx (the SDK's one poller,
    ``nemogym_sdk._net.ready.poll_ready``).

    Raises :class:`ServerStartError` as soon as one exits, and
    :class:`ServerNotReadyError` naming the first laggard when ``timeout`` passes.
    """
    by_name = {proc.name: proc for proc in processes}

    def still_running(name: str) -> None:
        proc = by_name[name]
        returncode = proc.popen.poll()
        if returncode is not None:
            raise ServerStartError(proc.name, returncode, proc.log_path, proc.tail())

    with requests.Session() as session:
        session.trust_env = False  # loopback only: never route through a proxy
        pending = poll_ready(
            {proc.name: proc.health_url for proc in processes},
            timeout=timeout,
            interval=_POLL_INTERVAL_S,
            session=session,
            before_probe=still_running,
        )
    if pending:
        proc = by_name[next(iter(pending))]
        raise ServerNotReadyError(proc.name, timeout, proc.log_path, proc.tail())


def wait_answering(name: str, url: str, timeout: float) -> None:
    """Poll ``url`` until it gives any HTTP answer (status ignored), as NeMo Gym's own
    model-endpoint check does; :class:`ServerNotReadyError` naming ``name`` on timeout."""
    with requests.Session() as session:
        session.trust_env = False
        pending = poll_ready(
            {name: url},
            timeout=timeout,
            interval=_POLL_INTERVAL_S,
            session=session,
            ready=answered,
        )
    if pending:
        raise ServerNotReadyError(name, timeout, None, pending[name])


def group_alive(pgid: int) -> bool:
    """Whether any process of the group ``pgid`` still exists (zombies count until reaped)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, sig)


def stop_all(processes: Sequence[ServerProcess], grace: float) -> None:
    """SIGTERM every process group, wait up to ``grace`` seconds, then SIGKILL the rest.

    Returns once every leader is reaped and no member of any group is left.
    Safe to call again (already-stopped processes are skipped).
    """
    processes = [proc for proc in processes if not proc.stopped]
    for proc in processes:
        if proc.popen.poll() is None or group_alive(proc.pid):
            _signal_group(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    for proc in processes:
        remaining = max(0.0, deadline - time.monotonic())
        try:
            proc.popen.wait(timeout=remaining)
        except subprocess.TimeoutExpired:
            logger.warning("%s (pid %d) ignored SIGTERM for %.1f s", proc.name, proc.pid, grace)
    # Leaders are reaped; kill whatever else is left in the groups (children of servers).
    for proc in processes:
        if proc.popen.poll() is None or group_alive(proc.pid):
            _signal_group(proc.pid, signal.SIGKILL)
    for proc in processes:
        proc.popen.wait()
        proc.stopped = _wait_group_gone(proc.pid, timeout=5.0)
        if proc.stopped:
            unwatch(proc.pid)


def _wait_group_gone(pgid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.02)
    if group_alive(pgid):
        logger.warning("process group %d still has members after SIGKILL", pgid)
        return False
    return True
