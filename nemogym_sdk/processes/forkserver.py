"""Fork servers: a venv's interpreter that imports a server's heavy modules once, then forks
each server from there instead of starting a new interpreter for it.

A NeMo Gym server spends ~2.5 s of CPU importing NeMo Gym (pandas, scipy, openai,
fastapi) before it runs a line of its own; a stack starts three or four of them. Forked
from a process that has those modules already, a server starts in a fraction of that, and
runs the same code: ``python [-P] script args`` (or ``python -m module args``) in its
directory, with its environment, as the leader of its own session
(``_forkserver_main.py`` says exactly what the child does). :func:`spawn
<nemogym_sdk.processes.spawn>` uses one when a `ProcessSpec` names modules to preload;
``NEMOGYM_FORK_SERVERS=0`` turns them off (every server a new interpreter, as NeMo Gym's
launcher starts them).

One fork server per interpreter, preload list and environment per process (`shared_env`:
the preloaded modules were imported under the child's own environment, but for
``PYTHONPATH``, ``NEMO_GYM_*`` and pytest's ``PYTEST_CURRENT_TEST``), started on first use;
it forks no more once this process exits (its stdin closes, this process's death included)
and exits when the servers it forked have ended. They are stopped as any other (their
process groups, the watchdog). Its children are not this process's: `ForkedChild` gives
what a ``subprocess.Popen`` would (``pid``, ``poll``, ``wait``, ``returncode``) from the exit
statuses the fork server reports.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import queue
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from nemogym_sdk.processes.errors import ServerStartError

__all__ = [
    "FORK_SERVERS_ENV_VAR",
    "MAX_FORK_SERVERS",
    "ForkServer",
    "ForkServerError",
    "ForkedChild",
    "fork_server",
    "fork_servers_enabled",
    "forkable",
    "shared_env",
]

FORK_SERVERS_ENV_VAR = "NEMOGYM_FORK_SERVERS"
"""Set to ``0`` to start every server as a new interpreter."""

_MAIN = Path(__file__).with_name("_forkserver_main.py")
_REPLY_TIMEOUT_S = 60.0
"""How long a fork server may take to preload, or to answer a fork request."""
_POLL_S = 0.05
_INHERITED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
"""Signals a child ignores when this process does (``exec`` keeps them ignored) and starts
with the interpreter's handler otherwise; each request names them (``reset``)."""
MAX_FORK_SERVERS = 4
"""Fork servers one process keeps (each holds its imports: ~250 MB for NeMo Gym, ~400 MB for
torch and transformers, more for vLLM): one per kind of server a process may start (NeMo
Gym, a sampler, vLLM, and one more)."""


def fork_servers_enabled() -> bool:
    """False when ``$NEMOGYM_FORK_SERVERS`` is ``0``."""
    return os.environ.get(FORK_SERVERS_ENV_VAR, "1").strip() != "0"


def forkable(argv: Sequence[str]) -> bool:
    """Whether ``argv`` is ``python [-P] script [args]`` or ``python -m module [args]``,
    what a fork server can run."""
    rest = list(argv[1:])
    if rest[:1] == ["-m"]:
        return len(rest) >= 2 and not rest[1].startswith("-")
    if rest[:1] == ["-P"]:
        rest = rest[1:]
    return bool(rest) and not rest[0].startswith("-")


_OWN_TO_EACH_CHILD = frozenset({"PYTHONPATH", "PYTEST_CURRENT_TEST", "TORCHINDUCTOR_CACHE_DIR"})


def _own_to_each_child(name: str) -> bool:
    """Variables that differ from server to server and are read when a server runs, never
    when the preloaded modules are imported: ``PYTHONPATH`` and ``NEMO_GYM_*`` differ
    between the servers of one stack (checked for NeMo Gym 0.7.0), and pytest names the
    test running in ``PYTEST_CURRENT_TEST``, which no preloaded module reads (checked for
    torch, transformers, peft, vLLM 0.32 and NeMo Gym 0.7.0): keyed by it, every test
    would start fork servers of its own. torch sets ``TORCHINDUCTOR_CACHE_DIR`` in its own
    process's environment the first time inductor looks for its cache, after the imports
    (a trainer's sampler is started after that, its fork server made before:
    `nemogym_sdk.processes.zygote`)."""
    return name in _OWN_TO_EACH_CHILD or name.startswith("NEMO_GYM_")


def shared_env(env: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """What of ``env`` the fork server's imports may read: the whole of it but the
    variables each child has its own of (``PYTHONPATH``, ``NEMO_GYM_*``,
    ``PYTEST_CURRENT_TEST``, ``TORCHINDUCTOR_CACHE_DIR``). A child is forked only from a
    fork server started with exactly its own."""
    return tuple(sorted((k, v) for k, v in env.items() if not _own_to_each_child(k)))


class ForkServerError(ServerStartError):
    """The fork server did not start, or did not answer a fork request: ``server`` names it
    (``fork server <python>``), ``log_tail`` holds its last output or what went wrong."""

    def __init__(self, python: str, what: str) -> None:
        super().__init__(f"fork server {python}", None, None, what)
        self.python = python
        self.what = what

    def __reduce__(self) -> tuple[type[ServerStartError], tuple[object, ...]]:
        return (type(self), (self.python, self.what))


class ForkedChild:
    """A process forked by a `ForkServer`: the part of ``subprocess.Popen`` the SDK uses."""

    def __init__(self, server: ForkServer, pid: int, args: Sequence[str]) -> None:
        self._server = server
        self.pid = pid
        self.args = list(args)
        self.returncode: int | None = None

    def poll(self) -> int | None:
        """Its exit code once it has ended (negative: the signal that ended it), else None."""
        if self.returncode is None:
            self.returncode = self._server.exit_code(self.pid)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Wait for it to end; ``subprocess.TimeoutExpired`` after ``timeout`` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
            self._server.wait_for_news(_POLL_S)
        assert self.returncode is not None
        return self.returncode


class ForkServer:
    """``_forkserver_main.py`` run by ``python`` with ``preload`` imported (see the module)."""

    def __init__(
        self,
        python: str,
        preload: Sequence[str],
        env: tuple[tuple[str, str], ...],
        *,
        start: Callable[[IO[bytes]], Any] | None = None,
    ) -> None:
        """Start it (``start(log)``: another way to start it, given the file its stderr goes
        to, returning what it uses of a ``subprocess.Popen``; `nemogym_sdk.processes.zygote`)
        and wait until it has imported ``preload``."""
        self.owner = os.getpid()
        self.python = python
        self.preload = tuple(preload)
        self._lock = threading.Lock()
        self._news = threading.Condition()
        self._exits: dict[int, int] = {}
        self._replies: queue.Queue[dict[str, Any]] = queue.Queue()
        self._gone = False
        self._log = tempfile.TemporaryFile()  # noqa: SIM115 -- its stderr, closed in close()
        argv = [python, "-u", "-P", str(_MAIN), *self.preload]
        try:
            self._process = (
                start(self._log)
                if start is not None
                else subprocess.Popen(
                    argv,
                    env=dict(env),
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=self._log,
                )
            )
        except OSError as exc:
            self._log.close()
            raise ForkServerError(python, f"cannot start it: {exc}") from exc
        self._reader = threading.Thread(target=self._read, name="nemogym-forkserver", daemon=True)
        self._reader.start()
        try:
            self._answer("ready")
        except ForkServerError:
            self.close(wait=5.0)
            if self._process.poll() is None:
                self._process.kill()
                self._process.wait()
            raise

    def _read(self) -> None:
        stdout = self._process.stdout
        assert stdout is not None
        for line in stdout:
            message = json.loads(line)
            if "exit" in message:
                with self._news:
                    self._exits[int(message["exit"])] = int(message["code"])
                    self._news.notify_all()
            else:
                self._replies.put(message)
        with self._news:
            self._gone = True
            self._news.notify_all()
        self._replies.put({"error": f"the fork server ended:\n{self._tail()}"})
        stdout.close()
        self._log.close()

    def _answer(self, key: str) -> dict[str, Any]:
        try:
            reply = self._replies.get(timeout=_REPLY_TIMEOUT_S)
        except queue.Empty:
            reply = {"error": f"no answer in {_REPLY_TIMEOUT_S:.0f} s"}
        if key not in reply:
            raise ForkServerError(self.python, str(reply.get("error", reply)))
        return reply

    def fork(
        self,
        argv: Sequence[str],
        *,
        cwd: Path,
        env: Mapping[str, str],
        log_path: Path,
        stderr_path: Path | None = None,
    ) -> ForkedChild:
        """Fork ``argv`` (``python [-P] script args`` or ``python -m module args``; see
        `forkable`) in ``cwd``, with ``env`` as its whole environment, stdout appended to
        ``log_path`` and stderr to ``stderr_path`` (to ``log_path`` without one). It ignores
        the signals of `_INHERITED` that this process ignores now, as a child it started
        itself would."""
        request: dict[str, object] = {
            "argv": list(argv),
            "cwd": str(cwd),
            "env": dict(env),
            "log": str(log_path),
            "reset": [int(s) for s in _INHERITED],
            "ignore": [int(s) for s in _INHERITED if signal.getsignal(s) == signal.SIG_IGN],
        }
        if stderr_path is not None:
            request["err"] = str(stderr_path)
        stdin = self._process.stdin
        assert stdin is not None
        with self._lock:
            try:
                stdin.write((json.dumps(request) + "\n").encode())
                stdin.flush()
            except (BrokenPipeError, OSError, ValueError) as exc:
                raise ForkServerError(self.python, f"it is gone: {exc}") from exc
            reply = self._answer("pid")
        return ForkedChild(self, int(reply["pid"]), argv)

    @property
    def alive(self) -> bool:
        return not self._gone and self._process.poll() is None

    def exit_code(self, pid: int) -> int | None:
        """``pid``'s exit code as reported, None while it runs. If the fork server itself
        has ended, a child it can no longer report on counts as ended (code -1) once gone."""
        with self._news:
            code = self._exits.get(pid)
            gone = self._gone
        if code is not None or not gone:
            return code
        return -1 if _ended(pid) else None

    def wait_for_news(self, timeout: float) -> None:
        """Wait until a child's exit is reported (or ``timeout`` seconds pass)."""
        with self._news:
            self._news.wait(timeout)

    def _tail(self) -> str:
        with contextlib.suppress(ValueError, OSError):
            self._log.seek(0)
            lines = self._log.read().decode(errors="replace").splitlines()
            return "\n".join(lines[-20:]) or "<no output>"
        return "<no output>"

    def close(self, wait: float = 5.0) -> None:
        """Close its stdin: it forks no more and exits once its children have ended (they
        run on, stopped by their owner as any server, their exits still reported). Waits
        up to ``wait`` seconds for it to exit."""
        stdin = self._process.stdin
        if stdin is not None:
            with contextlib.suppress(OSError):
                stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._process.wait(timeout=wait)
        self._reader.join(timeout=min(wait, 1.0))


def _ended(pid: int) -> bool:
    """Whether ``pid`` is gone, or a zombie its new parent has not reaped yet."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[-1].split()[0] == "Z"


_SERVERS: dict[tuple[str, tuple[str, ...], tuple[tuple[str, str], ...]], ForkServer] = {}
_RETIRED: list[ForkServer] = []
"""Closed fork servers whose children still run: kept until they exit."""
_SERVERS_LOCK = threading.Lock()


def fork_server(
    python: str,
    preload: Sequence[str],
    env: Mapping[str, str],
    *,
    start: Callable[[IO[bytes]], Any] | None = None,
) -> ForkServer:
    """This process's fork server for ``python`` with ``preload`` imported under ``env``'s
    `shared_env`, started on first use (by ``start``, see `ForkServer`), a new one after a
    fork or if it has ended. The least recently used beyond `MAX_FORK_SERVERS` is closed
    (each holds its imports)."""
    key = (python, tuple(preload), shared_env(env))
    with _SERVERS_LOCK:
        _RETIRED[:] = [s for s in _RETIRED if s._process.poll() is None]
        server = _SERVERS.pop(key, None)
        if server is None or not server.alive or server.owner != os.getpid():
            if server is not None:
                _retire(server)
            server = ForkServer(python, preload, key[2], start=start)
        _SERVERS[key] = server  # the most recently used last
        while len(_SERVERS) > MAX_FORK_SERVERS:
            _retire(_SERVERS.pop(next(iter(_SERVERS))))
        return server


def _retire(server: ForkServer) -> None:
    """Close ``server`` without waiting (if it is this process's); keep it until it exits."""
    if server.owner == os.getpid():
        server.close(wait=0.0)
        _RETIRED.append(server)


def _forget_servers() -> None:
    """In a forked child: the fork servers are its parent's, and the lock may have been
    held at the fork (`nemogym_sdk.processes.zygote` forks while `fork_server` holds it)."""
    global _SERVERS_LOCK
    _SERVERS_LOCK = threading.Lock()
    _SERVERS.clear()
    _RETIRED.clear()


os.register_at_fork(after_in_child=_forget_servers)


def _close_servers() -> None:
    with _SERVERS_LOCK:
        servers = [s for s in [*_SERVERS.values(), *_RETIRED] if s.owner == os.getpid()]
        _SERVERS.clear()
        _RETIRED.clear()
    for server in servers:
        server.close()


# Registered at import, before any stack registers its own stop: exit handlers run last
# first, so the servers are stopped (their exits reported) before their fork servers close.
atexit.register(_close_servers)
