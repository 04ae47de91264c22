"""Fork servers (``nemogym_sdk.processes.forkserver``): a server forked from a pre-warmed
interpreter runs as ``python [-P] script args`` would, leads its own session, and is
waited for, stopped and reported on as a ``subprocess.Popen`` is. Real processes; the
interpreter is this one."""

from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from nemogym_sdk.processes import ServerStartError, spawn, stop_all
from nemogym_sdk.processes.forkserver import (
    FORK_SERVERS_ENV_VAR,
    MAX_FORK_SERVERS,
    ForkedChild,
    ForkServerError,
    fork_server,
    forkable,
    shared_env,
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
    assert not forkable(["python"])
    assert not forkable(["python", "-P"]) and not forkable(["python", "-u", "app.py"])
    assert forkable(["python", "-m", "nemogym_sdk.serve", "--port", "1"])
    assert not forkable(["python", "-m"]) and not forkable(["python", "-m", "-x"])


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


SIGNALS = textwrap.dedent(
    """
    import json, signal, sys
    names = {signal.SIG_DFL: "default", signal.SIG_IGN: "ignored"}
    def disposition(sig):
        handler = signal.getsignal(sig)
        return names.get(handler, getattr(handler, "__name__", repr(handler)))
    print(json.dumps({s.name: disposition(s) for s in (
        signal.SIGINT, signal.SIGTERM, signal.SIGPIPE, signal.SIGCHLD, signal.SIGHUP
    )}))
    print("to stderr", file=sys.stderr)
    """
)


def test_a_forked_child_starts_with_a_new_interpreters_signal_handlers_and_its_own_stderr(
    tmp_path: Path,
) -> None:
    """A forked child's signal handlers are those of ``python script`` started by this
    process (the fork server itself ignores SIGINT): SIGINT ignored where this process
    ignores it, else KeyboardInterrupt; a closed pipe is BrokenPipeError. Its stderr can go
    to a file of its own."""
    (tmp_path / "signals.py").write_text(SIGNALS)
    server = fork_server(sys.executable, ("json",), _env())
    previous = signal.getsignal(signal.SIGINT)
    try:
        for sigint, expected in ((signal.SIG_IGN, "ignored"), (previous, None)):
            signal.signal(signal.SIGINT, sigint)  # a pytest-xdist worker ignores SIGINT
            fresh = subprocess.run(
                [sys.executable, "signals.py"],
                cwd=tmp_path,
                capture_output=True,
                text=True,
                timeout=30,
            )
            out, err = tmp_path / f"{expected}.out", tmp_path / f"{expected}.err"
            child = server.fork(
                [sys.executable, "signals.py"],
                cwd=tmp_path,
                env=_env(),
                log_path=out,
                stderr_path=err,
            )
            assert child.wait(timeout=30) == 0
            forked = json.loads(out.read_text())
            assert forked == json.loads(fresh.stdout)
            assert forked["SIGPIPE"] == "ignored" and forked["SIGTERM"] == "default"
            if expected is not None:
                assert forked["SIGINT"] == expected
            elif previous != signal.SIG_IGN:
                assert forked["SIGINT"] == "default_int_handler"
            assert err.read_text() == fresh.stderr == "to stderr\n"
    finally:
        signal.signal(signal.SIGINT, previous)


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


def test_a_module_runs_as_python_dash_m_would(tmp_path: Path) -> None:
    package = tmp_path / "code"
    package.mkdir()
    (package / "report_module.py").write_text(REPORT)
    log = tmp_path / "module.log"
    process = spawn(
        "module",
        [sys.executable, "-m", "report_module", "4"],
        cwd=tmp_path,
        env=_env(PYTHONPATH=str(package)),
        log_path=log,
        health_url="http://127.0.0.1:9/",
        preload=PRELOAD,
    )
    assert isinstance(process.popen, ForkedChild)
    assert process.popen.wait(timeout=30) == 4
    report = _report(log)
    assert report["name"] == "__main__" and report["preloaded"] is True
    assert report["argv"] == [str(package / "report_module.py"), "4"]
    assert report["path"] == [str(tmp_path), str(package)]


def test_a_child_is_forked_only_under_its_own_environment() -> None:
    """The preloaded modules were imported under the child's environment: another value of
    any variable gets a fork server of its own, except the ones each server has its own of
    (``PYTHONPATH``, ``NEMO_GYM_*``, pytest's ``PYTEST_CURRENT_TEST``), which are read when
    a server runs."""
    env = _env()
    first = fork_server(sys.executable, ("json",), env)
    same = fork_server(
        sys.executable,
        ("json",),
        {**env, "PYTHONPATH": "/x", "NEMO_GYM_CONFIG_PATH": "a", "PYTEST_CURRENT_TEST": "t"},
    )
    other = fork_server(sys.executable, ("json",), {**env, "OMP_NUM_THREADS": "7"})
    assert same is first and other is not first
    assert shared_env(
        {"PYTHONPATH": "/x", "NEMO_GYM_X": "1", "PYTEST_CURRENT_TEST": "t", "A": "1"}
    ) == (("A", "1"),)


def test_a_process_keeps_a_few_fork_servers_and_closes_the_least_recently_used(
    tmp_path: Path,
) -> None:
    """Each fork server holds its imports: past ``MAX_FORK_SERVERS`` the one used longest ago
    is closed. It forks no more, but reports its children until they end, then exits."""
    (tmp_path / "sleep.py").write_text("import time\ntime.sleep(60)\n")
    envs = [_env(FORK_TEST=str(n)) for n in range(MAX_FORK_SERVERS + 1)]
    first = fork_server(sys.executable, ("json",), envs[0])
    child = first.fork(
        [sys.executable, "sleep.py"], cwd=tmp_path, env=envs[0], log_path=tmp_path / "s.log"
    )
    others = [fork_server(sys.executable, ("json",), env) for env in envs[1:-1]]
    assert fork_server(sys.executable, ("json",), envs[0]) is first  # used again: kept
    newest = fork_server(sys.executable, ("json",), envs[-1])
    assert first.alive and newest.alive
    assert others[0]._process.wait(timeout=10) == 0  # evicted: no child, so it exited
    assert fork_server(sys.executable, ("json",), envs[0]) is first
    os.killpg(child.pid, signal.SIGTERM)
    assert child.wait(timeout=10) == -signal.SIGTERM


def test_a_fork_server_that_cannot_start_is_a_server_start_error(tmp_path: Path) -> None:
    with pytest.raises(ForkServerError, match="cannot start it") as absent:
        fork_server(str(tmp_path / "no-python"), ("json",), _env())
    assert isinstance(absent.value, ServerStartError)
    broken = tmp_path / "python"
    broken.write_text("#!/bin/sh\necho 'no such interpreter here' >&2\nexit 3\n")
    broken.chmod(0o755)
    with pytest.raises(ForkServerError, match="no such interpreter here") as failed:
        fork_server(str(broken), ("json",), _env())
    again = pickle.loads(pickle.dumps(failed.value))  # errors cross process boundaries
    assert type(again) is ForkServerError and str(again) == str(failed.value)
