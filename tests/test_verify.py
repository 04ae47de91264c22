"""The one ``/verify`` scorer: which resources server scores a row, typed results, and the
deployment record it resolves against (``ServerDirectory.default_agent``)."""

from __future__ import annotations

import pickle
from typing import Any

import pytest

from nemogym_sdk import RolloutStatus, ServerDirectory, UnknownAgentError, Verifier
from nemogym_sdk.directory import ServerInfo
from nemogym_sdk.errors import DiscoveryError
from nemogym_sdk.verify import resources_server_for
from nemogym_sdk.wire import AGENTS, RESOURCES
from tests.fakes import resources_server


def deployment(agents: dict[str, str | None], servers: list[str]) -> ServerDirectory:
    """Agents (name -> the resources server their config names) and resources servers."""
    infos = [
        ServerInfo(
            name=name,
            server_type=AGENTS,
            url=f"http://127.0.0.1:{9000 + i}",
            config={} if ref is None else {"resources_server": {"type": RESOURCES, "name": ref}},
        )
        for i, (name, ref) in enumerate(agents.items())
    ]
    infos += [
        ServerInfo(name=name, server_type=RESOURCES, url=f"http://127.0.0.1:{9100 + i}")
        for i, name in enumerate(servers)
    ]
    return ServerDirectory(infos)


def row(server: str | None = None, agent: str | None = None) -> dict[str, Any]:
    data: dict[str, Any] = {"responses_create_params": {"input": "x"}}
    if server is not None:
        data["resources_server_ref"] = {"name": server}
    if agent is not None:
        data["agent_ref"] = {"name": agent}
    return data


def test_the_rows_own_server_comes_first() -> None:
    """1. The row's resources_server_ref wins over the default, its agent and 'the only one'."""
    directory = deployment({"a": "alpha"}, ["alpha", "beta"])
    assert resources_server_for(row("beta", agent="a"), directory, default="alpha") == "beta"


def test_the_default_comes_before_the_agents_server() -> None:
    """2. For a row that names none, the caller's default wins over its agent's server."""
    directory = deployment({"a": "alpha"}, ["alpha", "beta"])
    assert resources_server_for(row(agent="a"), directory, default="beta") == "beta"


def test_the_agents_server_then_the_only_one() -> None:
    """3. The row's agent's configured server (or the default agent's); 4. the only one."""
    directory = deployment({"a": "alpha", "b": "beta"}, ["alpha", "beta"])
    assert resources_server_for(row(agent="b"), directory) == "beta"
    single_agent = deployment({"a": "beta"}, ["alpha", "beta"])
    assert resources_server_for(row(), single_agent) == "beta"  # the only agent is the default
    assert resources_server_for(row(), deployment({"a": None}, ["gamma"])) == "gamma"


def test_an_unresolvable_or_unknown_server_is_a_discovery_error() -> None:
    directory = deployment({"a": "alpha", "b": "beta"}, ["alpha", "beta"])
    with pytest.raises(DiscoveryError, match="cannot tell which resources server"):
        resources_server_for(row(), directory)  # two agents, no default, two servers
    with pytest.raises(DiscoveryError, match=r"'gone' \(from the row's resources_server_ref\)"):
        resources_server_for(row("gone"), directory)
    with pytest.raises(DiscoveryError, match=r"'gone' \(from the default\)"):
        resources_server_for(row(), directory, default="gone")


def test_score_returns_typed_results_in_input_order() -> None:
    """``score`` resolves each row, scores what it can, and turns what it cannot into an
    INVALID result saying why: nothing raises, nothing is a silent 0."""
    with resources_server(reward=0.75) as scorer:
        directory = ServerDirectory.from_urls(resources_servers={"scorer": scorer.url})
        with Verifier(directory) as verifier:
            results = verifier.score([row("gone"), row()], ["a", "b"])
        assert scorer.calls("/verify") == 1
    assert [r.status for r in results] == [RolloutStatus.INVALID, RolloutStatus.OK]
    assert results[0].reward is None and "gone" in str(results[0].error)
    assert results[1].reward == 0.75


def test_default_agent_is_one_rule() -> None:
    """The only agent is the default; an explicit one replaces it; an unknown one is an
    error; the record survives pickling (ranks receive it by broadcast)."""
    one = deployment({"a": None}, [])
    assert one.default_agent == "a"
    two = deployment({"a": None, "b": None}, [])
    assert two.default_agent is None
    assert two.with_default_agent("b").default_agent == "b"
    assert two.with_default_agent("b").with_overrides({"a": "127.0.0.1:1"}).default_agent == "b"
    with pytest.raises(UnknownAgentError, match="no agent named 'c'"):
        two.with_default_agent("c")
    copied = pickle.loads(pickle.dumps(two.with_default_agent("b")))
    assert (copied.default_agent, copied.agents) == ("b", two.agents)
