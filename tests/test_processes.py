"""Process groups, readiness, shutdown and the one start recipe (``nemogym_sdk.processes``),
with small Python children instead of real servers."""

from __future__ import annotations

import os
import pickle
import sys
import time
from pathlib import Path

import pytest

from nemogym_sdk.processes import (
    ServerNotReadyError,
    ServerProcess,
    ServerStartError,
    free_loopback_ports,
    group_alive,
    spawn,
    start_server,
    stop_all,
    tail,
    wait_ready,
)
from nemogym_sdk.processes import start as start_module

HTTP_SERVER = """
import http.server, sys
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b"ok")
    def log_message(self, *args):
        pass
print("serving", flush=True)
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
"""

STUBBORN = """
import signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
print("child-pid", child.pid, flush=True)
time.sleep(600)
"""


def _spawn(tmp_path: Path, name: str, code: str, *args: str, port: int = 9) -> ServerProcess:
    return spawn(
        name,
        [sys.executable, "-c", code, *args],
        cwd=tmp_path,
        env=dict(os.environ),
        log_path=tmp_path / f"{name}.log",
        health_url=f"http://127.0.0.1:{port}/",
    )


def test_ready_server_then_stopped_by_group(tmp_path: Path) -> None:
    """A server that answers is ready; stop_all leaves nothing of its group."""
    (port,) = free_loopback_ports(1)
    proc = _spawn(tmp_path, "web", HTTP_SERVER, str(port), port=port)
    try:
        wait_ready([proc], timeout=30)
        assert os.getpgid(proc.pid) == proc.pid
    finally:
        stop_all([proc], grace=5)
    assert proc.popen.returncode is not None
    assert not group_alive(proc.pid)
    assert "serving" in proc.tail()


def test_early_exit_raises_with_name_status_and_tail(tmp_path: Path) -> None:
    """A process that dies during start-up raises ServerStartError quoting its last lines."""
    code = "import sys\nfor i in range(100): print('line', i)\nsys.exit(3)"
    proc = _spawn(tmp_path, "crashy", code)
    try:
        with pytest.raises(ServerStartError) as caught:
            wait_ready([proc], timeout=30)
    finally:
        stop_all([proc], grace=1)
    error = caught.value
    assert (error.server, error.returncode, error.log_path) == ("crashy", 3, proc.log_path)
    assert error.log_tail.splitlines()[-1] == "line 99"
    assert "line 59" not in error.log_tail
    assert "'crashy' exited with status 3" in str(error) and "line 99" in str(error)
    assert pickle.loads(pickle.dumps(error)).log_tail == error.log_tail


def test_deadline_raises_not_ready(tmp_path: Path) -> None:
    """A process that never answers raises ServerNotReadyError when the deadline passes."""
    proc = _spawn(tmp_path, "mute", "import time; print('waiting', flush=True); time.sleep(600)")
    began = time.monotonic()
    try:
        with pytest.raises(ServerNotReadyError, match="'mute' did not become ready") as caught:
            wait_ready([proc], timeout=0.5)
    finally:
        stop_all([proc], grace=1)
    assert time.monotonic() - began < 10
    assert isinstance(caught.value, TimeoutError)
    assert not group_alive(proc.pid)


def test_sigterm_ignored_escalates_to_sigkill_of_the_whole_group(tmp_path: Path) -> None:
    """A leader ignoring SIGTERM, and its child, are SIGKILLed after the grace period."""
    proc = _spawn(tmp_path, "stubborn", STUBBORN)
    try:
        child_pid = _wait_for_child_pid(proc)
        assert os.getpgid(child_pid) == proc.pid
        began = time.monotonic()
    finally:
        stop_all([proc], grace=0.5)
    assert 0.4 < time.monotonic() - began < 10
    assert proc.popen.returncode == -9
    assert not group_alive(proc.pid)
    assert proc.stopped, "an emptied group is never signalled again"
    stop_all([proc], grace=0.5)  # idempotent


def _wait_for_child_pid(proc: ServerProcess) -> int:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        for line in proc.tail().splitlines():
            if line.startswith("child-pid "):
                return int(line.split()[1])
        time.sleep(0.05)
    raise AssertionError(f"no child pid in the log:\n{proc.tail()}")


def test_tail_of_missing_and_long_files(tmp_path: Path) -> None:
    """tail() is empty for a missing file and returns only the last lines of a long one."""
    assert tail(tmp_path / "absent.log") == ""
    path = tmp_path / "long.log"
    path.write_text("".join(f"{i}\n" for i in range(100_000)))
    assert tail(path, 3) == "99997\n99998\n99999"


def _recording_spawns(monkeypatch: pytest.MonkeyPatch) -> list[ServerProcess]:
    """Every process ``start_server`` spawns, kept for the test to inspect."""
    spawned: list[ServerProcess] = []

    def recording(*args: object, **kwargs: object) -> ServerProcess:
        process = spawn(*args, **kwargs)  # type: ignore[arg-type]
        spawned.append(process)
        return process

    monkeypatch.setattr(start_module, "spawn", recording)
    return spawned


def test_start_server_returns_a_server_that_answers(tmp_path: Path) -> None:
    """The recipe: spawn, wait until the health URL answers, hand the process over."""
    (port,) = free_loopback_ports(1)
    argv = [sys.executable, "-c", HTTP_SERVER, str(port)]
    proc = start_server(
        "web",
        argv,
        log_path=tmp_path / "web.log",
        health_url=f"http://127.0.0.1:{port}/",
        ready_timeout=30,
    )
    try:
        assert proc.popen.poll() is None and "serving" in proc.tail()
    finally:
        stop_all([proc], grace=5)
    assert not group_alive(proc.pid)


@pytest.mark.parametrize("failure", ["deadline", "interrupt"])
def test_start_server_stops_the_group_before_any_failure_propagates(
    failure: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server that never answers, or a Ctrl-C while waiting: the error propagates, and
    the process group (the child it started too) is gone by then."""
    spawned = _recording_spawns(monkeypatch)
    expected: type[BaseException] = ServerNotReadyError
    if failure == "interrupt":
        expected = KeyboardInterrupt

        def interrupted(processes: object, timeout: float) -> None:
            raise KeyboardInterrupt

        monkeypatch.setattr(start_module, "wait_ready", interrupted)
    with pytest.raises(expected):
        start_server(
            "stubborn",
            [sys.executable, "-c", STUBBORN],
            log_path=tmp_path / "stubborn.log",
            health_url="http://127.0.0.1:9/",
            ready_timeout=0.5,
            grace=0.5,
        )
    (proc,) = spawned
    assert proc.popen.returncode is not None
    assert not group_alive(proc.pid)
