"""The watchdog process of ``nemogym_sdk.processes.watchdog``: run as a file, stdlib only.

    python -I _watchdog_main.py OWNER_PID   (stdin: the read end of the owner's pipe)

It reads ``watch PGID SIGNAL GRACE group|leader`` and ``unwatch PGID`` lines from stdin.
When the owner is gone (stdin ends: every copy of the write end closed; or its parent is no
longer ``OWNER_PID``: a process the owner forked still holds the pipe), it sends each group
still watched its signal (to the group, or to its leader only), waits up to the longest
grace for the groups to empty, SIGKILLs what is left, says so in one line on stderr, and
exits.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import sys
import time

POLL_S = 0.5
"""How often it checks that its owner is still its parent."""
KILL_WAIT_S = 2.0
"""How long it waits for SIGKILLed groups to empty."""


def _alive(pgid: int) -> bool:
    """Whether a member of group ``pgid`` runs: a zombie (dead, its parent has not reaped
    it yet; the owner at a normal exit is such a parent) does not count."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # a member we may not signal: not ours to judge, count it
        return True
    try:
        names = os.listdir("/proc")
    except OSError:  # no /proc: every member counts
        return True
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as stat:
                fields = stat.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] != b"Z":
            return True
    return False


def _signal(pgid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)


def _wait(groups: list[int], seconds: float) -> list[int]:
    deadline = time.monotonic() + seconds
    left = [g for g in groups if _alive(g)]
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = [g for g in left if _alive(g)]
    return left


def _apply(line: str, groups: dict[int, tuple[int, float, bool]]) -> None:
    """One line of the owner's; one it cannot read changes nothing (it never stops it)."""
    words = line.split()
    try:
        if len(words) == 5 and words[0] == "watch" and words[4] in ("group", "leader"):
            groups[int(words[1])] = (int(words[2]), float(words[3]), words[4] == "leader")
        elif len(words) == 2 and words[0] == "unwatch":
            groups.pop(int(words[1]), None)
    except ValueError:
        pass


def _stop(owner: int, groups: dict[int, tuple[int, float, bool]]) -> None:
    pending = [g for g in groups if _alive(g)]
    if not pending:
        return
    for pgid in pending:
        signum, _, leader_only = groups[pgid]
        if leader_only:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pgid, signum)
        else:
            _signal(pgid, signum)
    left = _wait(pending, max(groups[g][1] for g in pending))
    for pgid in left:
        _signal(pgid, signal.SIGKILL)
    left = _wait(left, KILL_WAIT_S)
    how = f"{len(pending) - len(left)} stopped" + (f", {left} still there" if left else "")
    sys.stderr.write(  # on a line of its own: the owner may have died mid-line (a progress bar)
        f"\nnemogym-sdk watchdog: process {owner} ended without stopping the servers it "
        f"started; process groups {pending}: {how}\n"
    )


def main(argv: list[str]) -> int:
    owner = int(argv[1])
    for signum in (signal.SIGINT, signal.SIGHUP):  # a terminal's signals are the owner's
        signal.signal(signum, signal.SIG_IGN)
    groups: dict[int, tuple[int, float, bool]] = {}
    pending = b""
    stdin = sys.stdin.fileno()
    owned = True
    while True:
        # once the owner is gone, only what it wrote before it went is read (no waiting)
        readable, _, _ = select.select([stdin], [], [], POLL_S if owned else 0)
        if not readable:
            if not owned:
                break
            owned = os.getppid() == owner
            continue
        chunk = os.read(stdin, 65536)
        if not chunk:
            break
        *lines, pending = (pending + chunk).split(b"\n")
        for line in lines:
            _apply(line.decode(), groups)
    _stop(owner, groups)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
