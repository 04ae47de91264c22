"""Host normalization and URL helpers."""

from __future__ import annotations

import pytest

from nemogym_sdk import ConfigError, base_url, normalize_host, routable_host
from nemogym_sdk.hosts import is_loopback, is_wildcard, split_host_port


@pytest.mark.parametrize(
    ("host", "expected"),
    [
        pytest.param("0.0.0.0", "127.0.0.1", id="ipv4-wildcard"),
        pytest.param("::", "127.0.0.1", id="ipv6-wildcard"),
        pytest.param("localhost", "127.0.0.1", id="localhost"),
        pytest.param(" LOCALHOST ", "127.0.0.1", id="localhost-case-space"),
        pytest.param("127.0.0.1", "127.0.0.1", id="loopback"),
        pytest.param("10.1.2.3", "10.1.2.3", id="private"),
        pytest.param("gym-head.internal", "gym-head.internal", id="dns-name"),
    ],
)
def test_normalize_host(host: str, expected: str) -> None:
    """Wildcards and localhost map to the fallback; everything else passes through."""
    assert normalize_host(host) == expected


@pytest.mark.parametrize(
    ("host", "head", "expected"),
    [
        pytest.param("0.0.0.0", "10.0.0.5", "10.0.0.5", id="remote-wildcard"),
        pytest.param("127.0.0.1", "10.0.0.5", "10.0.0.5", id="remote-loopback"),
        pytest.param("localhost", "gym-head", "gym-head", id="remote-localhost"),
        pytest.param("10.0.0.7", "10.0.0.5", "10.0.0.7", id="remote-routable"),
        pytest.param("0.0.0.0", "127.0.0.1", "127.0.0.1", id="local-wildcard"),
        pytest.param("127.0.0.1", "localhost", "127.0.0.1", id="local-loopback"),
        pytest.param("10.0.0.7", "127.0.0.1", "10.0.0.7", id="local-routable"),
    ],
)
def test_routable_host(host: str, head: str, expected: str) -> None:
    """Loopback and wildcard hosts of a remote head's servers become the head's host."""
    assert routable_host(host, head) == expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        pytest.param("h", ("h", None), id="host"),
        pytest.param("h:8000", ("h", 8000), id="host-port"),
        pytest.param("[::1]:9", ("::1", 9), id="ipv6-port"),
        pytest.param("http://h:8000/v1", ("h", 8000), id="url"),
        pytest.param("https://h/v1", ("h", 443), id="https-default-port"),
        pytest.param("http://h", ("h", 80), id="http-default-port"),
    ],
)
def test_split_host_port(value: str, expected: tuple[str, int | None]) -> None:
    """host, host:port, [v6]:port and URLs all split."""
    assert split_host_port(value) == expected


@pytest.mark.parametrize("value", ["", "  ", "h:notaport", "h:70000", "h:0", "http://:80"])
def test_split_host_port_rejects(value: str) -> None:
    """Empty hosts and bad ports raise ConfigError naming the value."""
    with pytest.raises(ConfigError):
        split_host_port(value)


def test_base_url_forms() -> None:
    """base_url canonicalizes to scheme://host:port with an optional fallback rewrite."""
    assert base_url("h:8000") == "http://h:8000"
    assert base_url("https://h:8443/v1/") == "https://h:8443"
    assert base_url("h", default_port=11000) == "http://h:11000"
    assert base_url("0.0.0.0:5", fallback="10.0.0.1") == "http://10.0.0.1:5"
    assert base_url("[::1]:5") == "http://[::1]:5"
    with pytest.raises(ConfigError, match="no port"):
        base_url("h")


def test_loopback_and_wildcard_predicates() -> None:
    """The predicates know IPv4/IPv6 loopback ranges and wildcard spellings."""
    assert is_loopback("127.3.4.5") and is_loopback("::1") and is_loopback("[::1]")
    assert not is_loopback("10.0.0.1") and not is_loopback("example.com")
    assert is_wildcard("0.0.0.0") and is_wildcard("::") and not is_wildcard("127.0.0.1")


def test_openai_server_urls_are_canonical() -> None:
    """``server_root`` strips ``/v1`` and a trailing slash, keeps a path prefix, adds the
    scheme and names the wildcard host; ``openai_url`` puts ``/v1`` back."""
    from nemogym_sdk.hosts import openai_url, server_root

    assert server_root("0.0.0.0:8000/v1/") == "http://127.0.0.1:8000"
    assert server_root("https://gw.example/vllm/v1") == "https://gw.example/vllm"
    assert openai_url("http://127.0.0.1:8000") == "http://127.0.0.1:8000/v1"
    assert openai_url("http://[::1]:8000/v1") == "http://[::1]:8000/v1"
    with pytest.raises(ConfigError, match="not an http"):
        server_root("ftp://host:1")


def test_same_endpoint_treats_this_machine_as_one_host() -> None:
    from nemogym_sdk.hosts import same_endpoint

    assert same_endpoint("http://localhost:8000/v1", "0.0.0.0:8000")
    assert same_endpoint("127.0.0.1:8000", "http://127.0.0.5:8000")
    assert not same_endpoint("127.0.0.1:8000", "127.0.0.1:8001")
    assert not same_endpoint("10.0.0.5:8000", "127.0.0.1:8000")
    assert not same_endpoint("", "127.0.0.1:8000")


def test_a_bare_ipv6_address_is_a_host() -> None:
    assert split_host_port("::1") == ("::1", None)
    assert base_url("fe80::1", default_port=9) == "http://[fe80::1]:9"
