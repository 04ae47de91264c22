"""This process as its own fork server (``nemogym_sdk.processes.zygote``): a server started
with ``fork=True`` afterwards is forked from a copy of this process made while it ran one
thread, which holds nothing of it but its memory (its imports): no descriptor of it, the
stop signals at their defaults. Each case runs in an interpreter of its own (a pytest
worker runs threads). Real processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from nemogym_sdk.processes.forkserver import FORK_SERVERS_ENV_VAR
from tests.procs import alive, gone_within

OWNER = textwrap.dedent(
    """
    import json, os, signal, sys, threading, time
    from pathlib import Path
    from nemogym_sdk.processes import spawn
    from nemogym_sdk.processes.zygote import fork_this_process

    out = Path(sys.argv[1])
    json.MARK = "set in the owner before the copy"  # only a copy of this process has it
    read_end, write_end = os.pipe()  # a descriptor of the owner's the servers must not hold
    signal.signal(signal.SIGTERM, lambda *_: None)  # the owner's own handler
    if sys.argv[2] == "thread":
        threading.Thread(target=time.sleep, args=(5,), daemon=True).start()
    made = fork_this_process(("json",), dict(os.environ))
    server = spawn(
        "report",
        [sys.executable, str(out / "report.py")],
        cwd=out,
        env=dict(os.environ),
        log_path=out / "report.log",
        health_url="http://127.0.0.1:9/",  # not asked: the report ends by itself
        preload=("json",),
    )
    server.popen.wait(timeout=30)
    import psutil
    me = psutil.Process()
    copies = [p.pid for p in me.children() if p.cmdline() == me.cmdline()]  # not the watchdog
    print(json.dumps({"made": made, "owner": os.getpid(), "pipe": write_end, "copies": copies}))
    """
)
REPORT = textwrap.dedent(
    """
    import json, os, signal
    import psutil
    parent = psutil.Process(os.getppid())
    print(json.dumps({
        "mark": getattr(json, "MARK", None),
        "parent": parent.pid,
        "grandparent": parent.ppid(),
        "fds": sorted(int(fd) for fd in os.listdir("/proc/self/fd")),
        "sigterm_default": signal.getsignal(signal.SIGTERM) == signal.SIG_DFL,
    }))
    """
)


def _owner(tmp_path: Path, mode: str, **env: str) -> tuple[dict[str, object], dict[str, object]]:
    """Run the owner (``mode``: ``plain`` or ``thread``); its line and the server's report."""
    (tmp_path / "report.py").write_text(REPORT)
    done = subprocess.run(
        [sys.executable, "-c", OWNER, str(tmp_path), mode],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    owner = json.loads(done.stdout.strip().splitlines()[-1])
    lines = (tmp_path / "report.log").read_text().splitlines()
    return owner, json.loads(next(line for line in lines if line.startswith("{")))


def test_a_server_is_forked_from_a_copy_of_this_process_that_holds_none_of_its_files(
    tmp_path: Path,
) -> None:
    owner, report = _owner(tmp_path, "plain")
    assert owner["made"] is True
    assert report["mark"] == "set in the owner before the copy"  # this process's memory
    assert report["grandparent"] == owner["owner"]  # forked by the owner's copy
    assert report["parent"] != owner["owner"]
    assert owner["pipe"] not in report["fds"] and max(report["fds"]) <= 3  # 0-2, listdir's
    assert report["sigterm_default"] is True


def test_no_copy_is_made_while_another_thread_runs(tmp_path: Path) -> None:
    """A thread's locks would be copied held: a new interpreter imports instead."""
    owner, report = _owner(tmp_path, "thread")
    assert owner["made"] is False
    assert report["mark"] is None and report["grandparent"] == owner["owner"]


def test_no_copy_without_fork_servers(tmp_path: Path) -> None:
    owner, report = _owner(tmp_path, "plain", **{FORK_SERVERS_ENV_VAR: "0"})
    assert owner["made"] is False
    assert report["mark"] is None and report["parent"] == owner["owner"]  # a new interpreter


def test_the_copy_ends_with_its_owner(tmp_path: Path) -> None:
    """The owner exits (its server has ended): its copy forks no more and exits too."""
    owner, _ = _owner(tmp_path, "plain")
    copies = owner["copies"]
    assert isinstance(copies, list) and len(copies) == 1  # the copy; the server has ended
    assert gone_within(lambda: [pid for pid in copies if alive(pid)], 10) < 10
