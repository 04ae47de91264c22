"""Fork servers (``nemogym_sdk.processes.forkserver``): a server forked from a pre-warmed
interpreter runs as ``python [-P] script args`` would, leads its own session, and is
waited for, stopped and reported on as a ``subprocess.Popen`` is. Real processes; the
interpreter is this one."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from nemogym_sdk.processes import spawn, stop_all
from nemogym_sdk.processes.forkserver import (
    FORK_SERVERS_ENV_VAR,
    ForkedChild,
    fork_server,
    forkable,
)

PRELOAD = ("json", "http.server")

REPORT = textwrap.dedent(
    """
    import json, os, sys
    print(json.dumps({
        "name": __name__,
        "argv": sys.argv,
        "cwd": os.getcwd(),
        "path": sys.path[:2],
        "mark": os.environ.get("MARK"),
        "leaked": os.environ.get("ONLY_IN_THE_PARENT"),
        "session": os.getsid(0) == os.getpid() == os.getpgid(0),
        "stdin": sys.stdin.read(),
        "preloaded": "http.server" in sys.modules,
    }))
    sys.exit(int(sys.argv[1]))
    """
)


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "ONLY_IN_THE_PARENT"}
    return {**env, **extra}


def _report(log: Path) -> dict[str, object]:
    lines = [line for line in log.read_text().splitlines() if line.startswith("{")]
    report: dict[str, object] = json.loads(lines[-1])
    return report


def test_forkable_takes_a_script_with_or_without_safe_path() -> None:
    assert forkable(["python", "app.py"]) and forkable(["python", "-P", "main.py", "x"])
    assert not forkable(["python", "-m", "module"]) and not forkable(["python"])
    assert not forkable(["python", "-P"]) and not forkable(["python", "-u", "app.py"])


def test_a_forked_server_runs_its_script_as_a_new_interpreter_would(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ONLY_IN_THE_PARENT", "1")
    server_dir, extra = tmp_path / "server", tmp_path / "extra"
    server_dir.mkdir()
    extra.mkdir()
    (server_dir / "app.py").write_text(REPORT)
    log = tmp_path / "logs" / "app.log"
    process = spawn(
        "app",
        [sys.executable, "app.py", "3"],
        cwd=server_dir,
        env=_env(MARK="m", PYTHONPATH=str(extra)),
        log_path=log,
        health_url="http://127.0.0.1:9/",
        preload=PRELOAD,
    )
    assert isinstance(process.popen, ForkedChild)
    assert process.popen.wait(timeout=30) == 3 and process.popen.poll() == 3
    report = _report(log)
    assert report == {
        "name": "__main__",
        "argv": ["app.py", "3"],
        "cwd": str(server_dir),
        "path": [str(server_dir), str(extra)],
        "mark": "m",
        "leaked": None,
        "session": True,
        "stdin": "",
        "preloaded": True,
    }
    assert "(forked, json, http.server imported)" in log.read_text().splitlines()[0]


def test_safe_path_keeps_the_scripts_directory_off_sys_path(tmp_path: Path) -> None:
    (tmp_path / "main.py").write_text(REPORT)
    log = tmp_path / "main.log"
    process = spawn(
        "main",
        [sys.executable, "-P", str(tmp_path / "main.py"), "0"],
        cwd=tmp_path,
        env=_env(PYTHONPATH=""),
        log_path=log,
        health_url="http://127.0.0.1:9/",
        preload=PRELOAD,
    )
    assert process.popen.wait(timeout=30) == 0
    assert str(tmp_path) not in _report(log)["path"]  # type: ignore[operator]


def test_a_crash_is_a_traceback_and_exit_1_and_a_signal_is_a_negative_code(
    tmp_path: Path,
) -> None:
    (tmp_path / "crash.py").write_text("raise RuntimeError('the server broke')\n")
    (tmp_path / "sleep.py").write_text("import time\ntime.sleep(60)\n")
    common = {"cwd": tmp_path, "env": _env(), "health_url": "http://127.0.0.1:9/"}
    crash = spawn(
        "crash",
        [sys.executable, "crash.py"],
        log_path=tmp_path / "crash.log",
        preload=PRELOAD,
        **common,  # type: ignore[arg-type]
    )
    assert crash.popen.wait(timeout=30) == 1
    assert "RuntimeError: the server broke" in (tmp_path / "crash.log").read_text()
    sleeper = spawn(
        "sleep",
        [sys.executable, "sleep.py"],
        log_path=tmp_path / "sleep.log",
        preload=PRELOAD,
        **common,  # type: ignore[arg-type]
    )
    with pytest.raises(subprocess.TimeoutExpired):
        sleeper.popen.wait(timeout=0.3)
    assert sleeper.popen.poll() is None
    stop_all([sleeper], grace=5.0)
    assert sleeper.stopped and sleeper.popen.poll() == -signal.SIGTERM


def test_without_fork_servers_a_server_is_a_new_interpreter(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(FORK_SERVERS_ENV_VAR, "0")
    (tmp_path / "app.py").write_text(REPORT)
    process = spawn(
        "app",
        [sys.executable, "app.py", "0"],
        cwd=tmp_path,
        env=_env(),
        log_path=tmp_path / "app.log",
        health_url="http://127.0.0.1:9/",
        preload=PRELOAD,
    )
    assert isinstance(process.popen, subprocess.Popen)
    assert process.popen.wait(timeout=30) == 0
    assert _report(tmp_path / "app.log")["preloaded"] is False


def test_a_dead_fork_server_leaves_its_servers_running_and_is_replaced(tmp_path: Path) -> None:
    (tmp_path / "sleep.py").write_text("import time\ntime.sleep(60)\n")
    server = fork_server(sys.executable, ("json",), _env())
    child = server.fork(
        [sys.executable, "sleep.py"], cwd=tmp_path, env=_env(), log_path=tmp_path / "s.log"
    )
    os.kill(server._process.pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while server.alive and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not server.alive
    assert child.poll() is None  # orphaned, not ended
    replacement = fork_server(sys.executable, ("json",), _env())
    assert replacement is not server and replacement.alive
    os.killpg(child.pid, signal.SIGKILL)
    assert child.wait(timeout=10) == -1  # ended; its status went to whoever adopted it
