"""Host normalization and URL helpers.

NeMo Gym servers advertise the host they bound: often ``0.0.0.0`` (every interface)
or ``127.0.0.1``/``localhost``. Neither is an address a client on another machine can
dial. ``normalize_host`` rewrites wildcard and ``localhost`` names to a fallback (the
seed contract); ``routable_host`` also rewrites loopback addresses when the servers
belong to a remote head server, because "loopback" then means the head's machine.

URL helpers accept ``host``, ``host:port``, ``[v6]:port`` and full URLs, and return
one canonical form, so nothing downstream re-parses; this module is the one place URLs
are canonicalised:

- ``base_url``: ``scheme://host:port`` of a NeMo Gym server (no path);
- ``server_root`` / ``openai_url``: an OpenAI-compatible server (vLLM, ``nemogym_sdk.serve``)
  without and with its ``/v1``, a path prefix kept (``https://gw/vllm/v1``);
- ``same_endpoint``: whether two URLs reach the same host and port (loopback and wildcard
  spellings of this machine are one host).
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
    "openai_url",
    "routable_host",
    "same_endpoint",
    "server_root",
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
    """Split ``host``, ``host:port``, ``[v6]:port``, a bare IPv6 address or a URL into
    ``(host, port)``.

    IPv6 hosts come back without brackets. Raises ``ConfigError`` for an empty host or
    a port that is not a number in 1-65535.
    """
    text = value.strip()
    if not text:
        raise ConfigError("empty host")
    if "://" not in text and "[" not in text and text.count(":") > 1:
        text = f"[{text}]"  # a bare IPv6 address, e.g. ``::1``
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


def server_root(url: str) -> str:
    """``scheme://host:port[/prefix]`` of an OpenAI-compatible server given with or without
    ``/v1``.

    ``host:port`` gets ``http://``; a wildcard host (``0.0.0.0``) becomes ``127.0.0.1``.

    >>> server_root("http://127.0.0.1:8000/v1/")
    'http://127.0.0.1:8000'
    >>> server_root("0.0.0.0:8000")
    'http://127.0.0.1:8000'
    """
    text = url.strip()
    parts = urlsplit(text if "://" in text else f"http://{text}")
    try:
        host, port = parts.hostname, parts.port
    except ValueError as exc:
        raise ConfigError(f"invalid port in server URL {url!r}: {exc}") from None
    if parts.scheme not in ("http", "https") or not host:
        raise ConfigError(f"not an http(s) server URL: {url!r}; pass e.g. http://127.0.0.1:8000")
    if is_wildcard(host):
        host = "127.0.0.1"
    netloc = f"[{host}]" if ":" in host else host
    if port is not None:
        netloc = f"{netloc}:{port}"
    path = parts.path.rstrip("/")
    if path.endswith("/v1"):
        path = path[: -len("/v1")]
    return f"{parts.scheme}://{netloc}{path}"


def openai_url(url: str) -> str:
    """``server_root(url) + "/v1"``: the base URL OpenAI clients and NeMo Gym's
    ``vllm_model`` take.

    >>> openai_url("127.0.0.1:8000")
    'http://127.0.0.1:8000/v1'
    """
    return f"{server_root(url)}/v1"


def _endpoint(url: str) -> tuple[str, int | None] | None:
    try:
        host, port = split_host_port(url)
    except ConfigError:
        return None
    host = host.lower()
    if is_loopback(host) or is_wildcard(host):
        host = "127.0.0.1"
    return host, port


def same_endpoint(a: str, b: str) -> bool:
    """Whether URLs ``a`` and ``b`` reach the same host and port; ``localhost``,
    ``127.0.0.1`` and ``0.0.0.0`` count as one host. A URL without a host matches nothing.

    >>> same_endpoint("http://localhost:8000/v1", "0.0.0.0:8000")
    True
    """
    left = _endpoint(a)
    return left is not None and left == _endpoint(b)
