"""``nemogym-train`` runs for the tests, forked from a warm interpreter.

A run spends ~4.5 s of CPU importing torch, transformers, peft and matplotlib before its
first line; the suite starts about fifty. Run in the tests' own environment, a trainer is
``python -m nemogym_sdk.train`` forked from a fork server that has imported them
(``nemogym_sdk.processes.forkserver``: the same code, run as ``python -m`` would, in a
session of its own). A run that needs another environment (``env=``), or every run with
``NEMOGYM_FORK_SERVERS=0``, is a new interpreter. Either way its stdout and stderr go to
files of its own, read by `Trainer.communicate`, and it is signalled and waited for by its
PID as a ``subprocess.Popen`` is.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import weakref
from collections.abc import Mapping
from pathlib import Path

from nemogym_sdk.processes.forkserver import ForkedChild, fork_server, fork_servers_enabled

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
"""What a run imports before its first step (``python -X importtime``: ~4.5 s of 5)."""
_PER_TEST = ("PYTEST_CURRENT_TEST",)
"""Variables pytest changes from test to test: not part of the fork server's key."""


def train_env() -> dict[str, str]:
    """The tests' environment for a run (bytecode written: a run imports ~2,000 modules)."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def train_argv(*flags: str) -> list[str]:
    return [sys.executable, "-m", "nemogym_sdk.train", *flags]


class Trainer:
    """A started ``nemogym-train``: the part of ``subprocess.Popen`` the tests use."""

    def __init__(self, argv: list[str], *, env: Mapping[str, str] | None, cwd: Path) -> None:
        self.args = argv
        files = Path(tempfile.mkdtemp(prefix="nemogym-train-"))
        weakref.finalize(self, shutil.rmtree, files, True)  # its output, once forgotten
        self._out, self._err = files / "stdout", files / "stderr"
        self._child: ForkedChild | subprocess.Popen[bytes]
        if env is None and fork_servers_enabled():
            env = train_env()
            key = {k: v for k, v in env.items() if k not in _PER_TEST}
            server = fork_server(sys.executable, TRAIN_PRELOAD, key)
            self._child = server.fork(
                argv, cwd=cwd, env=env, log_path=self._out, stderr_path=self._err
            )
        else:
            with self._out.open("wb") as out, self._err.open("wb") as err:
                self._child = subprocess.Popen(
                    argv, cwd=cwd, env=train_env() if env is None else dict(env),
                    stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                )  # fmt: skip
        self.pid = self._child.pid

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
        return tuple(  # type: ignore[return-value]
            p.read_text(errors="replace") if p.exists() else "" for p in (self._out, self._err)
        )

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        """Wait for the run to end (``subprocess.TimeoutExpired`` after ``timeout`` s), then
        (stdout, stderr)."""
        self.wait(timeout=timeout)
        return self.output()


def start(*flags: str, env: Mapping[str, str] | None = None, cwd: Path = REPO) -> Trainer:
    """``nemogym-train *flags`` started in ``cwd``: forked in the tests' environment, a new
    interpreter under ``env``."""
    return Trainer(train_argv(*flags), env=env, cwd=cwd)


def run(
    *flags: str, env: Mapping[str, str] | None = None, cwd: Path = REPO, timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    """``nemogym-train *flags`` run to its end (killed after ``timeout`` s), as
    ``subprocess.run(..., capture_output=True, text=True)`` reports it."""
    trainer = start(*flags, env=env, cwd=cwd)
    try:
        out, err = trainer.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        trainer.kill()
        trainer.wait()
        raise
    assert trainer.returncode is not None
    return subprocess.CompletedProcess(trainer.args, trainer.returncode, out, err)
