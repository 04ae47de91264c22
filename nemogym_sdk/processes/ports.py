"""Loopback addresses for the servers the SDK starts: ``LOOPBACK`` and free ports.

``free_loopback_ports`` picks ports that can be bound on 127.0.0.1 right now, from NeMo
Gym's own default range (``PORT_RANGE``), below Linux's ephemeral ports. The test suite uses it
too, rather than its framework's helper (pytest-asyncio's ``unused_tcp_port`` binds port 0,
which hands out an *ephemeral* port: between the pick and the server's bind, any of the
suite's hundreds of outgoing loopback connections may take it). Each port handed out is
claimed for ``CLAIM_SECONDS`` (a file per port, per user, in the temporary directory), so
that stacks starting at once on one machine do not pick the same port.
"""

from __future__ import annotations

import contextlib
import os
import random
import socket
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from nemogym_sdk.errors import ConfigError

__all__ = ["CLAIM_SECONDS", "LOOPBACK", "PORT_RANGE", "free_loopback_ports"]

LOOPBACK = "127.0.0.1"
"""Where every local server listens."""

PORT_RANGE = (10001, 20000)
"""Where ports are picked unless the config says otherwise (``port_range_low`` and
``_high``): NeMo Gym's own default range, below Linux's ephemeral ports (32768-60999), so
an outgoing connection cannot take a port between pick and bind."""


def free_loopback_ports(
    count: int, port_range: tuple[int, int] = PORT_RANGE, *, claims: Path | None = None
) -> list[int]:
    """``count`` distinct ports of ``port_range`` that can be bound on 127.0.0.1 right now.

    Candidates are tried in random order, each by binding it; a port in use is skipped. A
    port is free only until its server binds it, seconds later: so each port handed out is
    also claimed (a file in ``claims``, default one per user in the temporary directory), and
    for ``CLAIM_SECONDS`` no other call on this machine hands it out, in any process, unless
    the range has nothing else left. Without that, two stacks starting at once could pick
    the same port, and the slower server's readiness check would be answered by the other.
    """
    low, high = port_range
    where = _claims_dir() if claims is None else claims
    ports: list[int] = []
    taken: list[int] = []  # free but claimed by another call: the last resort
    for port in _random_order(range(low, high + 1), 4 * count + 16):
        if len(ports) == count:
            break
        if port in ports or port in taken or not _bindable(port):
            continue
        if where is None or _claim(where, port):
            ports.append(port)
        else:
            taken.append(port)
    ports += taken[: count - len(ports)]
    if len(ports) < count:
        raise ConfigError(f"only {len(ports)} of {count} ports free in {low}-{high}")
    return ports


CLAIM_SECONDS = 600.0
"""How long a port handed out by `free_loopback_ports` stays claimed: longer than any
server here takes from its start to its bind."""


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((LOOPBACK, port))
        except OSError:
            return False
    return True


def _young(path: Path) -> bool:
    return time.time() - path.stat().st_mtime < CLAIM_SECONDS


def _claims_dir() -> Path | None:
    """This user's claims directory; None where it cannot be made (claims are then skipped)."""
    path = Path(tempfile.gettempdir()) / f"nemogym_sdk-ports-{_user()}"
    try:
        path.mkdir(mode=0o700, exist_ok=True)
    except OSError:
        return None
    return path


def _user() -> str:
    getuid = getattr(os, "getuid", None)
    return str(getuid()) if getuid is not None else "user"


def _claim(claims: Path, port: int) -> bool:
    """Claim ``port`` for this call: False while another call's claim is younger than
    ``CLAIM_SECONDS``. An expired claim is taken over by renaming it first, which only one
    process can do."""
    path = claims / str(port)
    for _ in range(2):
        try:
            os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
            return True
        except FileExistsError:
            try:
                if _young(path):
                    return False
                expired = claims / f"{port}.{os.getpid()}.expired"
                os.rename(path, expired)
                if _young(expired):  # renamed a claim made since the check: give it back
                    with contextlib.suppress(OSError):
                        os.link(expired, path)
                    os.unlink(expired)
                    return False
                os.unlink(expired)
            except FileNotFoundError:  # another process is taking it over
                return False
        except OSError:  # the directory went away or is not writable: claims are advice
            return True
    return False


def _random_order(everything: range, first: int) -> Iterator[int]:
    """The ports of ``everything`` at random: ``first`` of them (nearly always enough),
    then the whole range shuffled, drawn only if those were not."""
    rng = random.SystemRandom()
    yield from rng.sample(everything, min(first, len(everything)))
    yield from rng.sample(everything, len(everything))
