"""Host normalization and URL helpers.

NeMo Gym servers advertise the host they bound: often ``0.0.0.0`` (every interface)
or ``127.0.0.1``/``localhost``. Neither is an address a client on another machine can
dial. ``normalize_host`` rewrites wildcard and ``localhost`` names to a fallback (the
seed contract); ``routable_host`` also rewrites loopback addresses when the servers
belong to a remote head server, because "loopback" then means the head's machine.

URL helpers accept ``host``, ``host:port``, ``[v6]:port`` and full URLs, and return
one canonical ``http://host:port`` form, so nothing downstream re-parses.
"""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

from nemogym_sdk.errors import ConfigError

__all__ = [
    "base_url",
    "is_loopback",
    "is_wildcard",
    "normalize_host",
    "routable_host",
    "split_host_port",
]

_WILDCARDS = frozenset({"0.0.0.0", "::", "[::]", "*", ""})


def _clean(host: str) -> str:
    return host.strip().lower()


def is_wildcard(host: str) -> bool:
    """Whether ``host`` means "every interface" (``0.0.0.0``, ``::``) rather than an address."""
    return _clean(host) in _WILDCARDS


def is_loopback(host: str) -> bool:
    """Whether ``host`` is ``localhost`` or a loopback address (``127.0.0.0/8``, ``::1``)."""
    name = _clean(host).strip("[]")
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def normalize_host(host: str, fallback: str = "127.0.0.1") -> str:
    """Map wildcard hosts and ``localhost`` to ``fallback``; pass every other host through.

    >>> normalize_host("0.0.0.0")
    '127.0.0.1'
    >>> normalize_host("localhost", fallback="10.0.0.1")
    '10.0.0.1'
    >>> normalize_host("192.168.1.50")
    '192.168.1.50'

    Loopback addresses such as ``127.0.0.1`` pass through (use ``routable_host`` when
    the servers belong to a remote head server).
    """
    name = _clean(host)
    if name in _WILDCARDS or name == "localhost":
        return fallback
    return host.strip()


def routable_host(host: str, head_host: str) -> str:
    """The address a client should dial for a server that advertised ``host``.

    If the head server is remote, wildcard and loopback hosts of its servers mean the
    head's machine and become ``head_host``. If the head is local, this is
    ``normalize_host(host)``.
    """
    head = normalize_host(head_host)
    if is_loopback(head):
        return normalize_host(host)
    if is_wildcard(host) or is_loopback(host):
        return head
    return host.strip()


def split_host_port(value: str, default_port: int | None = None) -> tuple[str, int | None]:
    """Split ``host``, ``host:port``, ``[v6]:port`` or a URL into ``(host, port)``.

    IPv6 hosts come back without brackets. Raises ``ConfigError`` for an empty host or
    a port that is not a number in 1-65535.
    """
    text = value.strip()
    if not text:
        raise ConfigError("empty host")
    parts = urlsplit(text if "://" in text else f"//{text}")
    try:
        host, port = parts.hostname, parts.port
    except ValueError as exc:
        raise ConfigError(f"invalid port in {value!r}: {exc}") from None
    if not host:
        raise ConfigError(f"no host in {value!r}")
    if port == 0:
        raise ConfigError(f"invalid port in {value!r}: 0")
    if port is None and parts.scheme and default_port is None:
        port = {"http": 80, "https": 443}.get(parts.scheme)
    return host, port if port is not None else default_port


def base_url(
    value: str,
    *,
    default_port: int | None = None,
    scheme: str = "http",
    fallback: str | None = None,
) -> str:
    """Canonical ``scheme://host:port`` for ``value`` (no path, no trailing slash).

    ``value`` may be ``host``, ``host:port`` or a URL; a scheme in ``value`` wins over
    ``scheme``. With ``fallback``, wildcard and ``localhost`` hosts are normalized to
    it. Raises ``ConfigError`` when no port is given and there is no default.
    """
    text = value.strip()
    if "://" in text:
        scheme = urlsplit(text).scheme or scheme
    host, port = split_host_port(text, default_port)
    if port is None:
        raise ConfigError(f"no port in {value!r} and no default port")
    if fallback is not None:
        host = normalize_host(host, fallback)
    if ":" in host:
        host = f"[{host}]"
    return f"{scheme}://{host}:{port}"
