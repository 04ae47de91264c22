"""Python programs the tests run (``nemogym-train``, the examples), forked from a warm
interpreter.

``nemogym-train`` spends ~4.5 s of CPU importing torch, transformers, peft and matplotlib
before its first line, and the suite starts about fifty runs; the examples import the same.
In the tests' own environment, ``python -m module args`` or ``python script args`` on this
interpreter is forked from a fork server that has imported them
(``nemogym_sdk.processes.forkserver``: the same code, run as the interpreter would run it,
in a session of its own). A program that needs another environment (``env=``), any other
command, and every program with ``NEMOGYM_FORK_SERVERS=0`` is a new process. Either way its
stdout and stderr go to files of its own, read by `Run.communicate`, and it is signalled
and waited for by its PID as a ``subprocess.Popen`` is.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path

from nemogym_sdk.processes.forkserver import (
    ForkedChild,
    fork_server,
    fork_servers_enabled,
    forkable,
)

REPO = Path(__file__).resolve().parents[1]
TRAIN_PRELOAD = (
    "torch",
    "transformers",
    "peft",
    "matplotlib.pyplot",
    "torch.distributed.checkpoint.state_dict",
    "nemogym_sdk.train.recipe",
    "nemogym_sdk.gym",
)
"""What ``nemogym-train`` imports before its first step (``python -X importtime``: ~4.5 s
of 5), and most of what the examples do."""


def run_env() -> dict[str, str]:
    """The tests' environment for a program (bytecode written: ``nemogym-train`` imports
    ~2,000 modules)."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def train_argv(*flags: str) -> list[str]:
    """``nemogym-train *flags`` on this interpreter."""
    return [sys.executable, "-m", "nemogym_sdk.train", *flags]


class Run:
    """A started program: the part of ``subprocess.Popen`` the tests use."""

    def __init__(self, argv: Sequence[str], *, env: Mapping[str, str] | None, cwd: Path) -> None:
        self.args = list(argv)
        files = Path(tempfile.mkdtemp(prefix="nemogym-run-"))
        weakref.finalize(self, shutil.rmtree, files, True)  # its output, once forgotten
        self._out, self._err = files / "stdout", files / "stderr"
        self._child: ForkedChild | subprocess.Popen[bytes]
        if env is None and self._forkable():
            env = run_env()
            server = fork_server(sys.executable, TRAIN_PRELOAD, env)
            self._child = server.fork(
                self.args, cwd=cwd, env=env, log_path=self._out, stderr_path=self._err
            )
        else:
            with self._out.open("wb") as out, self._err.open("wb") as err:
                self._child = subprocess.Popen(
                    self.args, cwd=cwd, env=run_env() if env is None else dict(env),
                    stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                )  # fmt: skip
        self.pid = self._child.pid

    def _forkable(self) -> bool:
        return self.args[0] == sys.executable and forkable(self.args) and fork_servers_enabled()

    @property
    def forked(self) -> bool:
        return isinstance(self._child, ForkedChild)

    @property
    def returncode(self) -> int | None:
        return self._child.returncode

    def poll(self) -> int | None:
        return self._child.poll()

    def wait(self, timeout: float | None = None) -> int:
        return self._child.wait(timeout=timeout)

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def output(self) -> tuple[str, str]:
        """(stdout, stderr) so far."""
        out, err = (
            p.read_text(errors="replace") if p.exists() else "" for p in (self._out, self._err)
        )
        return out, err

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        """Wait for the run to end (``subprocess.TimeoutExpired`` after ``timeout`` s), then
        (stdout, stderr)."""
        self.wait(timeout=timeout)
        return self.output()


def start(argv: Sequence[str], *, env: Mapping[str, str] | None = None, cwd: Path = REPO) -> Run:
    """``argv`` started in ``cwd``: forked in the tests' environment (``env`` None), a new
    process under ``env``."""
    return Run(argv, env=env, cwd=cwd)


def run(
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    cwd: Path = REPO,
    timeout: float = 600,
) -> subprocess.CompletedProcess[str]:
    """``argv`` run to its end (killed after ``timeout`` s), as ``subprocess.run(...,
    capture_output=True, text=True)`` reports it."""
    started = start(argv, env=env, cwd=cwd)
    try:
        out, err = started.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        started.kill()
        started.wait()
        raise
    assert started.returncode is not None
    return subprocess.CompletedProcess(started.args, started.returncode, out, err)
