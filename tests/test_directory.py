"""ServerDirectory discovery against a loopback head server with NeMo Gym's answer shapes."""

from __future__ import annotations

import socket
import time
from typing import Any

import pytest

from nemogym_sdk import (
    ConfigError,
    DiscoveryError,
    NotReadyError,
    ServerDirectory,
    UnknownAgentError,
)
from tests import fakes
from tests.fakes import agent_server

CONFIG = {
    "policy_base_url": "http://127.0.0.1:8000/v1",
    "head_server": {"host": "127.0.0.1", "port": 11000},
    "weather": {
        "resources_servers": {
            "example_single_tool_call": {"host": "0.0.0.0", "port": 19001, "domain": "agent"}
        }
    },
    "weather_agent": {
        "responses_api_agents": {
            "simple_agent": {
                "host": "127.0.0.1",
                "port": 19002,
                "resources_server": {"type": "resources_servers", "name": "weather"},
                "model_server": {"type": "responses_api_models", "name": "policy_model"},
            }
        }
    },
    "policy_model": {
        "responses_api_models": {
            "vllm_model": {"host": "127.0.0.1", "port": 19003, "base_url": "${policy_base_url}"}
        }
    },
}


def _instances(host: str) -> list[dict[str, Any]]:
    rows = []
    for name, port, kind, impl in [
        ("weather", 19001, "resources_servers", "example_single_tool_call"),
        ("weather_agent", 19002, "responses_api_agents", "simple_agent"),
        ("policy_model", 19003, "responses_api_models", "vllm_model"),
    ]:
        rows.append(
            {
                "process_name": name,
                "config_path": name,
                "server_type": kind,
                "name": impl,
                "host": host,
                "port": port,
                "url": f"http://{host}:{port}",
                "pid": 1,
            }
        )
    return rows


def head_server(host: str = "127.0.0.1", ready: bool = True) -> Any:
    """A head server for ``CONFIG``, answering like NeMo Gym's."""
    return fakes.head_server(CONFIG, _instances(host), ready=ready)


def test_discovers_servers_by_instance_name() -> None:
    """Agents, resources servers and models come back keyed by their top-level names."""
    with head_server() as head:
        directory = ServerDirectory.from_head(head.url)
    assert directory.agents == {"weather_agent": "http://127.0.0.1:19002"}
    assert directory.resources_servers == {"weather": "http://127.0.0.1:19001"}
    assert directory.models == {"policy_model": "http://127.0.0.1:19003"}
    assert directory.resources_server_of("weather_agent") == "weather"
    assert directory.head_url == head.url


def test_interpolations_resolve_against_the_config() -> None:
    """${policy_base_url} in a server config is resolved from the top-level key."""
    with head_server() as head:
        directory = ServerDirectory.from_head(head.url)
    (model,) = directory.servers("responses_api_models")
    assert model.config["base_url"] == "http://127.0.0.1:8000/v1"


def test_remote_head_rewrites_loopback_and_wildcard_hosts() -> None:
    """Servers of a head reached as 'localhost' stay local; a remote head's loopback is rewritten.

    The head is reached on 127.0.0.1 here, so we check the rewrite on a directory built
    from the same answers as seen from a remote head host.
    """
    from nemogym_sdk.directory import _servers_from

    servers = _servers_from(CONFIG, _instances("0.0.0.0"), head_host="10.1.2.3")
    assert {s.name: s.url for s in servers}["weather"] == "http://10.1.2.3:19001"
    local = _servers_from(CONFIG, _instances("0.0.0.0"), head_host="127.0.0.1")
    assert {s.name: s.url for s in local}["weather"] == "http://127.0.0.1:19001"


def test_overrides_replace_urls_and_reject_unknown_names() -> None:
    """An override swaps one server's URL; an unknown name is a ConfigError."""
    with head_server() as head:
        directory = ServerDirectory.from_head(head.url, overrides={"weather_agent": "gpu-box:7000"})
        assert directory.agents == {"weather_agent": "http://gpu-box:7000"}
        with pytest.raises(ConfigError, match="known servers"):
            ServerDirectory.from_head(head.url, overrides={"nope": "h:1"})


def test_unknown_agent_error_names_known_agents() -> None:
    """Looking up an unknown agent raises UnknownAgentError listing the known ones."""
    directory = ServerDirectory.from_urls(agents={"a": "h:1", "b": "h:2"})
    with pytest.raises(UnknownAgentError, match="known agents: a, b"):
        directory.agent_url("c")
    with pytest.raises(DiscoveryError):
        directory.resources_url("a")


def test_head_not_ready_times_out_with_reason() -> None:
    """A head that keeps answering 503 raises NotReadyError after the wait."""
    with head_server(ready=False) as head, pytest.raises(NotReadyError, match="HTTP 503"):
        ServerDirectory.from_head(head.url, wait=0.6)


def test_unreachable_head_raises_not_ready() -> None:
    """Nothing listening: NotReadyError names the head URL and how to start NeMo Gym."""
    with pytest.raises(NotReadyError, match=r"127\.0\.0\.1:9") as caught:
        ServerDirectory.from_head("127.0.0.1:9", wait=0.0, timeout=0.5)
    assert "gym env start" in str(caught.value) and "head_server=True" in str(caught.value)


def test_wait_until_ready_names_missing_servers() -> None:
    """Readiness polls each server and names the ones that never answered."""
    with agent_server() as live:
        directory = ServerDirectory.from_urls(agents={"live": live.url, "dead": "127.0.0.1:9"})
        directory.wait_until_ready(timeout=2.0, names=["live"])
        with pytest.raises(NotReadyError, match=r"dead \(http://127.0.0.1:9"):
            directory.wait_until_ready(timeout=0.5)


def test_unresponsive_names_frozen_and_dead_servers_by_type() -> None:
    """One probe each: a live server is left out whatever it answers; one that accepts the
    connection and never answers (frozen) and one that refuses it (dead) are named."""
    frozen = socket.socket()
    frozen.bind(("127.0.0.1", 0))
    frozen.listen(8)  # the kernel accepts; nobody ever reads
    port = frozen.getsockname()[1]
    try:
        with agent_server() as live:
            directory = ServerDirectory.from_urls(
                agents={"live": live.url},
                resources_servers={"frozen": f"127.0.0.1:{port}", "dead": "127.0.0.1:9"},
            )
            started = time.monotonic()
            silent = directory.unresponsive(timeout=0.5)
    finally:
        frozen.close()
    assert time.monotonic() - started < 3
    assert sorted(silent) == ["dead", "frozen"]
    assert silent["frozen"] == f"resources_servers http://127.0.0.1:{port}/: ReadTimeout"
    assert silent["dead"].startswith("resources_servers http://127.0.0.1:9/: Connection")
