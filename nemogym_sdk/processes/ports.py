"""Loopback addresses for the servers the SDK starts: ``LOOPBACK`` and free ports.

``free_loopback_ports`` picks ports that can be bound on 127.0.0.1 right now, from NeMo
Gym's own default range (``PORT_RANGE``), below Linux's ephemeral ports. The test suite uses it
too, rather than its framework's helper (pytest-asyncio's ``unused_tcp_port`` binds port 0,
which hands out an *ephemeral* port: between the pick and the server's bind, any of the
suite's hundreds of outgoing loopback connections may take it).
"""

from __future__ import annotations

import random
import socket
from collections.abc import Iterator

from nemogym_sdk.errors import ConfigError

__all__ = ["LOOPBACK", "PORT_RANGE", "free_loopback_ports"]

LOOPBACK = "127.0.0.1"
"""Where every local server listens."""

PORT_RANGE = (10001, 20000)
"""Where ports are picked unless the config says otherwise (``port_range_low`` and
``_high``): NeMo Gym's own default range, below Linux's ephemeral ports (32768-60999), so
an outgoing connection cannot take a port between pick and bind."""


def free_loopback_ports(count: int, port_range: tuple[int, int] = PORT_RANGE) -> list[int]:
    """``count`` distinct ports of ``port_range`` that can be bound on 127.0.0.1 right now.

    Candidates are tried in random order (so concurrent stacks rarely pick the same
    ones), each by binding it; a port in use is skipped.
    """
    low, high = port_range
    ports: list[int] = []
    for port in _random_order(range(low, high + 1), 4 * count + 16):
        if len(ports) == count:
            break
        if port in ports:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((LOOPBACK, port))
            except OSError:
                continue
        ports.append(port)
    if len(ports) < count:
        raise ConfigError(f"only {len(ports)} of {count} ports free in {low}-{high}")
    return ports


def _random_order(everything: range, first: int) -> Iterator[int]:
    """The ports of ``everything`` at random: ``first`` of them (nearly always enough),
    then the whole range shuffled, drawn only if those were not."""
    rng = random.SystemRandom()
    yield from rng.sample(everything, min(first, len(everything)))
    yield from rng.sample(everything, len(everything))
