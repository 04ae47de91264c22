"""Free loopback ports and their claims (``nemogym_sdk.processes.ports``): a port handed out
is not handed out again, in this process or another, until its claim expires."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from nemogym_sdk.errors import ConfigError
from nemogym_sdk.processes import ports as ports_module
from nemogym_sdk.processes.ports import CLAIM_SECONDS, LOOPBACK, free_loopback_ports


def _bindable_run(length: int) -> tuple[int, int]:
    """A range of ``length`` consecutive ports that can all be bound now."""
    for low in range(19000, 19900, length):
        if all(ports_module._bindable(port) for port in range(low, low + length)):
            return low, low + length - 1
    pytest.skip(f"no {length} consecutive free ports in 19000-19900")


def test_ports_handed_out_are_claimed_and_not_handed_out_again(tmp_path: Path) -> None:
    span = _bindable_run(6)
    first = free_loopback_ports(3, span, claims=tmp_path)
    second = free_loopback_ports(3, span, claims=tmp_path)
    assert len(set(first)) == 3 and len(set(second)) == 3
    assert not set(first) & set(second)  # both are free: only the claims keep them apart
    assert sorted(int(p.name) for p in tmp_path.iterdir()) == sorted(first + second)


def test_claimed_ports_are_the_last_resort_when_nothing_else_is_free(tmp_path: Path) -> None:
    span = _bindable_run(4)
    claimed = free_loopback_ports(4, span, claims=tmp_path)
    again = free_loopback_ports(2, span, claims=tmp_path)
    assert set(again) <= set(claimed) and len(set(again)) == 2
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        held.bind((LOOPBACK, span[0]))
        held.listen()
        with pytest.raises(ConfigError, match=r"only 3 of 4 ports free"):
            free_loopback_ports(4, span, claims=tmp_path)  # one is bound: claims do not help


def test_an_expired_claim_is_taken_over(tmp_path: Path) -> None:
    span = _bindable_run(2)
    first = free_loopback_ports(2, span, claims=tmp_path)
    old = time.time() - CLAIM_SECONDS - 1
    for path in tmp_path.iterdir():
        os.utime(path, (old, old))
    assert ports_module._claim(tmp_path, first[0])  # expired: claimed anew
    assert time.time() - (tmp_path / str(first[0])).stat().st_mtime < 60
    assert not ports_module._claim(tmp_path, first[0])  # and now it is young
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(str(p) for p in first)


def test_claims_are_advice_where_they_cannot_be_written(tmp_path: Path) -> None:
    missing = tmp_path / "gone" / "claims"
    span = _bindable_run(2)
    assert sorted(free_loopback_ports(2, span, claims=missing)) == list(range(span[0], span[1] + 1))


def test_processes_picking_at_once_never_share_a_port(tmp_path: Path) -> None:
    """Six processes take two ports each from a range of twelve at the same moment."""
    span = _bindable_run(12)
    code = (
        "import json, sys, time; from pathlib import Path\n"
        "from nemogym_sdk.processes.ports import free_loopback_ports\n"
        "time.sleep(max(0.0, float(sys.argv[1]) - time.time()))\n"
        f"print(json.dumps(free_loopback_ports(2, {span!r}, claims=Path(sys.argv[2]))))\n"
    )
    start = str(time.time() + 2.0)
    children = [
        subprocess.Popen(
            [sys.executable, "-c", code, start, str(tmp_path)], stdout=subprocess.PIPE, text=True
        )
        for _ in range(6)
    ]
    picked = [json.loads(child.communicate(timeout=60)[0]) for child in children]
    flat = [port for pair in picked for port in pair]
    assert len(flat) == 12 and len(set(flat)) == 12, picked
