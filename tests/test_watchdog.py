"""The watchdog (``nemogym_sdk.processes.watchdog``): an owner that starts servers with
``spawn`` and dies by SIGKILL leaves none of them, nor their children, behind; one that
stopped them leaves the watchdog nothing to do. Real processes: the owner is a Python
process of its own, its servers small Python children."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.procs import alive, gone_within

REPO = Path(__file__).resolve().parents[1]

OWNER = """
import json, os, signal, sys, time
from pathlib import Path
from nemogym_sdk.processes import spawn, stop_all
from nemogym_sdk.processes.watchdog import watch, watchdog_pid

work, how = Path(sys.argv[1]), sys.argv[2]
SERVERS = {
    # a server with a child of its own (both in its group)
    "parent": "import subprocess, sys, time; "
    "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); time.sleep(600)",
    # a server that ignores SIGTERM: SIGKILL after the grace
    "stubborn": "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    "time.sleep(600)",
    # a server that stops on SIGINT only, and says it got it (NeMo Gym's launcher's way)
    "launcher": "import signal, sys, time; from pathlib import Path; "
    "signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    "signal.signal(signal.SIGINT, lambda *a: (Path(sys.argv[1]).write_text('SIGINT'), "
    "sys.exit(0))); time.sleep(600)",
}
servers = {
    name: spawn(
        name,
        [sys.executable, "-c", code, str(work / "launcher.said")],
        cwd=work,
        env=dict(os.environ),
        log_path=work / f"{name}.log",
        health_url="http://127.0.0.1:9/",
    )
    for name, code in SERVERS.items()
    if name != "stubborn" or how == "kill"  # (it costs the grace, 5 s)
}
watch(servers["launcher"].pid, first_signal=signal.SIGINT, leader_only=True)  # as GymLauncher
time.sleep(0.5)  # the server with a child has started it
if how == "stop":
    stop_all(list(servers.values()), grace=0.5)
if how == "fork" and os.fork() == 0:  # a child that keeps the watchdog's pipe open
    time.sleep(600)
    os._exit(0)
print(json.dumps({"watchdog": watchdog_pid(), "groups": [s.pid for s in servers.values()]}),
      flush=True)
if how != "exit":
    time.sleep(600)
"""


def members(pgids: list[int]) -> list[int]:
    """The living (not zombie) processes of these process groups."""
    found = []
    for process in psutil.process_iter(["pid", "status"]):
        try:
            if os.getpgid(process.pid) in pgids and process.info["status"] != "zombie":
                found.append(process.pid)
        except (ProcessLookupError, psutil.Error):
            continue
    return found


def owner(tmp_path: Path, how: str) -> tuple[subprocess.Popen[str], dict[str, Any]]:
    """The owner started, with its servers up: (its process, its report)."""
    process = subprocess.Popen(
        [sys.executable, "-c", OWNER, str(tmp_path), how],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    line = process.stdout.readline()
    assert line, process.communicate()[1][-3000:]
    return process, json.loads(line)


def test_a_killed_owner_leaves_no_server_and_no_servers_child(tmp_path: Path) -> None:
    """SIGKILL runs no handler of the owner's; its watchdog stops every group it started,
    each with its first signal (SIGINT for the launcher-like one), SIGKILLs the one that
    ignores it after the grace, says so in one line, and exits."""
    process, report = owner(tmp_path, "kill")
    groups = report["groups"]
    assert len(groups) == 3 and len(members(groups)) == 4  # and one server's child
    process.kill()
    _, err = process.communicate(timeout=30)
    seconds = gone_within(lambda: members(groups), 15)
    assert seconds < 8  # the grace (5 s) for the stubborn one, then SIGKILL
    assert (tmp_path / "launcher.said").read_text() == "SIGINT"
    gone_within(lambda: alive(report["watchdog"]), 5)
    said = [line for line in err.splitlines() if "watchdog" in line]
    assert said == [
        f"nemogym-sdk watchdog: process {process.pid} ended without stopping the servers it "
        f"started; process groups {groups}: 3 stopped"
    ], err


def test_an_owner_that_stopped_its_servers_leaves_the_watchdog_nothing(tmp_path: Path) -> None:
    """Stopped groups are forgotten: the owner's death then stops nothing (a pgid might be
    reused by then) and the watchdog exits without a word."""
    process, report = owner(tmp_path, "stop")
    assert not members(report["groups"])
    process.kill()
    _, err = process.communicate(timeout=30)
    gone_within(lambda: alive(report["watchdog"]), 5)
    assert "watchdog" not in err, err
    assert not (tmp_path / "launcher.said").exists()


def test_a_normal_exit_without_stopping_stops_what_is_left(tmp_path: Path) -> None:
    """An owner that returns without stopping its servers: the watchdog stops them as the
    interpreter exits, and the owner waits for it."""
    process, report = owner(tmp_path, "exit")
    _, err = process.communicate(timeout=60)
    assert process.returncode == 0, err
    assert not members(report["groups"])
    assert not alive(report["watchdog"])
    assert "2 stopped" in err, err


def test_a_forked_child_holding_the_pipe_does_not_hide_the_owners_death(
    tmp_path: Path,
) -> None:
    """A process the owner forked without exec keeps the pipe's write end open; the watchdog
    sees that its parent changed and stops the groups anyway."""
    process, report = owner(tmp_path, "fork")
    forked = [c.pid for c in psutil.Process(process.pid).children() if c.pid != report["watchdog"]]
    forked = [pid for pid in forked if pid not in report["groups"]]
    try:
        assert len(forked) == 1, forked
        process.kill()
        process.wait(timeout=30)  # (its pipes stay open: the forked child holds them)
        gone_within(lambda: members(report["groups"]), 15)
        gone_within(lambda: alive(report["watchdog"]), 5)
        assert alive(forked[0])  # not a server: not the watchdog's to stop
    finally:
        for pid in forked:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        process.communicate(timeout=30)


@pytest.mark.parametrize(
    "line", ["watch 1 15 5.0", "watch x 15 5.0 group", "watch 1 15 5.0 all", "unwatch", "hi"]
)
def test_a_line_it_cannot_read_is_ignored(line: str) -> None:
    from nemogym_sdk.processes._watchdog_main import _apply

    groups = {7: (15, 5.0, False)}
    _apply(line, groups)
    assert groups == {7: (15, 5.0, False)}
    _apply("watch 7 2 1.5 leader", groups)  # a group watched again: the new way replaces it
    assert groups == {7: (2, 1.5, True)}
