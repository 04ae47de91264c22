"""``ServerDirectory``: where a NeMo Gym deployment's agents and resources servers listen.

Discovery asks the head server (default ``127.0.0.1:11000``):

- ``GET /server_instances``: one entry per spawned server (``process_name`` is the
  instance name rows refer to, plus ``server_type``, ``host``, ``port``);
- ``GET /global_config_dict_yaml``: the resolved global config, as YAML text inside a
  JSON string, with ``${...}`` interpolations left unresolved.

Hosts are made routable with ``routable_host``: a remote head's servers that advertise
``0.0.0.0`` or ``127.0.0.1`` are reached at the head's host. Deployments without a head
server are described with ``ServerDirectory.from_urls``; explicit ``overrides`` replace
discovered URLs by instance name.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

import attrs
import requests
import yaml

from nemogym_sdk._net.http import check, owned_session, send
from nemogym_sdk._net.ready import answered, poll_ready
from nemogym_sdk.errors import (
    ConfigError,
    DataError,
    DiscoveryError,
    NotReadyError,
    UnknownAgentError,
)
from nemogym_sdk.hosts import base_url, routable_host, split_host_port
from nemogym_sdk.wire import (
    AGENTS,
    ENVIRONMENT_SERVERS,
    HOST,
    MODELS,
    NAME,
    PORT,
    RESOURCES,
    RESOURCES_SERVER,
    SERVER_TYPES,
    decode_server_instance,
)

__all__ = [
    "AGENTS",
    "ENVIRONMENTS",
    "MODELS",
    "RESOURCES",
    "ServerDirectory",
    "ServerInfo",
    "resolve_interpolations",
]

ENVIRONMENTS = ENVIRONMENT_SERVERS
"""The environment servers' type (``nemogym_sdk.wire.ENVIRONMENT_SERVERS``)."""
DEFAULT_HEAD = "127.0.0.1:11000"

_INTERPOLATION = re.compile(r"\$\{([A-Za-z_][\w.]*)\}")


@attrs.frozen(kw_only=True)
class ServerInfo:
    """One server of the deployment."""

    name: str
    """Instance name: the top-level config key that rows and references use."""
    server_type: str
    """``responses_api_agents``, ``resources_servers``, ``responses_api_models`` or
    ``environment_servers``."""
    url: str
    """Routable base URL, ``http://host:port``."""
    implementation: str | None = None
    """Implementation directory, e.g. ``simple_agent`` or ``vllm_model``."""
    config: Mapping[str, Any] = attrs.field(factory=dict, eq=False, repr=False)
    """The server's own config block (interpolations resolved where possible)."""


class ServerDirectory:
    """Agents, resources servers and model servers of one deployment, by instance name.

    The SDK's one deployment record: ``from_head`` discovers a running NeMo Gym,
    ``from_urls`` describes one by hand, ``GymStack.directory`` is a stack the SDK started;
    ``AgentClient``, ``Verifier``, ``check_served_name`` and the adapters all take it. It
    pickles, so a trainer's main process can send it to the other ranks.

    Args:
        servers: the servers, by instance name.
        head_url: the head server's base URL, when there is one.
        config: the global config (what the head's ``/global_config_dict_yaml`` serves).
        default_agent: the agent for rows without ``agent_ref``; None: the only agent,
            when exactly one is deployed (see ``default_agent``).
    """

    def __init__(
        self,
        servers: Iterable[ServerInfo],
        *,
        head_url: str | None = None,
        config: Mapping[str, Any] | None = None,
        default_agent: str | None = None,
    ) -> None:
        self._servers = {s.name: s for s in servers}
        self.head_url = head_url
        """Base URL of the head server, when the directory came from one."""
        self.config: Mapping[str, Any] = config or {}
        """The global config (empty without a head server)."""
        if default_agent is not None:
            self.agent_url(default_agent)  # an unknown agent is an UnknownAgentError now
        self._default_agent = default_agent

    # --- construction -----------------------------------------------------------------

    @classmethod
    def from_urls(
        cls,
        *,
        agents: Mapping[str, str] | None = None,
        resources_servers: Mapping[str, str] | None = None,
        models: Mapping[str, str] | None = None,
    ) -> ServerDirectory:
        """A directory given explicitly (no head server). URLs may be ``host:port``."""
        parts = ((AGENTS, agents), (RESOURCES, resources_servers), (MODELS, models))
        return cls(info for kind, urls in parts for info in cls.of(urls or {}, kind).servers())

    @classmethod
    def of(cls, servers: Mapping[str, str] | ServerDirectory, server_type: str) -> ServerDirectory:
        """``servers`` as a directory: a ``ServerDirectory`` as it is, or a name -> URL
        mapping as servers of ``server_type`` (what ``AgentClient`` and ``Verifier`` take)."""
        if isinstance(servers, ServerDirectory):
            return servers
        return cls(
            ServerInfo(name=name, server_type=server_type, url=base_url(url))
            for name, url in servers.items()
        )

    @classmethod
    def from_head(
        cls,
        head: str = DEFAULT_HEAD,
        *,
        overrides: Mapping[str, str] | None = None,
        timeout: float = 10.0,
        wait: float = 0.0,
        session: requests.Session | None = None,
    ) -> ServerDirectory:
        """Discover a deployment from its head server.

        Args:
            head: head server as ``host:port`` or URL (port 11000 when omitted).
            overrides: instance name -> URL, replacing what the head reports.
            timeout: per-request timeout in seconds.
            wait: keep retrying for up to this many seconds until the head answers and
                reports ready (``/readyz``); 0 asks once.
            session: a ``requests.Session`` to reuse.

        Raises:
            NotReadyError: the head did not answer (or stayed not ready) within ``wait``.
            DiscoveryError: the head's answers cannot be understood.
        """
        head_url = base_url(head, default_port=11000)
        head_host = split_host_port(head_url)[0]
        with owned_session(session) as http:
            _wait_for_head(http, head_url, timeout, wait)
            config = resolve_interpolations(_fetch_config(http, head_url, timeout))
            instances = _fetch_json(http, f"{head_url}/server_instances", timeout)
        if not isinstance(instances, list):
            raise DiscoveryError(f"{head_url}/server_instances did not return a list")
        servers = _servers_from(config, instances, head_host)
        directory = cls(servers, head_url=head_url, config=config)
        return directory.with_overrides(overrides or {})

    def with_overrides(self, overrides: Mapping[str, str]) -> ServerDirectory:
        """A copy where each named instance's URL is replaced."""
        servers = dict(self._servers)
        for name, url in overrides.items():
            if name not in servers:
                raise ConfigError(
                    f"override for unknown server {name!r}; known servers: {self._names()}"
                )
            servers[name] = attrs.evolve(servers[name], url=base_url(url))
        return ServerDirectory(
            servers.values(),
            head_url=self.head_url,
            config=self.config,
            default_agent=self._default_agent,
        )

    # --- lookup ---------------------------------------------------------------------------

    def servers(self, server_type: str | None = None) -> list[ServerInfo]:
        """All servers, or those of one type, in name order."""
        return sorted(
            (s for s in self._servers.values() if server_type in (None, s.server_type)),
            key=lambda s: s.name,
        )

    def _urls(self, server_type: str) -> dict[str, str]:
        return {s.name: s.url for s in self.servers(server_type)}

    @property
    def agents(self) -> dict[str, str]:
        """Agent instance name -> base URL."""
        return self._urls(AGENTS)

    @property
    def resources_servers(self) -> dict[str, str]:
        """Resources server instance name -> base URL."""
        return self._urls(RESOURCES)

    @property
    def models(self) -> dict[str, str]:
        """Model server instance name -> base URL."""
        return self._urls(MODELS)

    def _names(self, server_type: str | None = None) -> str:
        names = [s.name for s in self.servers(server_type)]
        return ", ".join(names) if names else "(none)"

    @property
    def default_agent(self) -> str | None:
        """The agent rows without ``agent_ref`` go to: the one set explicitly
        (``with_default_agent``), else the only agent when exactly one is deployed, else
        None (such rows are then an error). The SDK's one copy of this rule."""
        if self._default_agent is not None:
            return self._default_agent
        agents = self.servers(AGENTS)
        return agents[0].name if len(agents) == 1 else None

    def with_default_agent(self, name: str | None) -> ServerDirectory:
        """A copy whose ``default_agent`` is ``name`` (None: the only-agent rule).

        Raises ``UnknownAgentError`` when ``name`` is not a deployed agent.
        """
        return ServerDirectory(
            self._servers.values(), head_url=self.head_url, config=self.config, default_agent=name
        )

    def agent_url(self, name: str) -> str:
        """Base URL of an agent; ``UnknownAgentError`` names the known agents."""
        info = self._servers.get(name)
        if info is None or info.server_type != AGENTS:
            raise UnknownAgentError(f"no agent named {name!r}; known agents: {self._names(AGENTS)}")
        return info.url

    def resources_url(self, name: str) -> str:
        """Base URL of a resources server; ``DiscoveryError`` names the known ones."""
        info = self._servers.get(name)
        if info is None or info.server_type != RESOURCES:
            raise DiscoveryError(
                f"no resources server named {name!r}; known: {self._names(RESOURCES)}"
            )
        return info.url

    def resources_server_of(self, agent: str) -> str | None:
        """The resources server an agent's config refers to, if the config says."""
        info = self._servers.get(agent)
        ref = info.config.get(RESOURCES_SERVER) if info is not None else None
        name = ref.get(NAME) if isinstance(ref, Mapping) else None
        return name if isinstance(name, str) else None

    def __repr__(self) -> str:
        return f"ServerDirectory(head_url={self.head_url!r}, servers=[{self._names()}])"

    # --- readiness --------------------------------------------------------------------------

    def wait_until_ready(
        self,
        *,
        timeout: float,
        names: Iterable[str] | None = None,
        interval: float = 0.25,
        session: requests.Session | None = None,
    ) -> None:
        """Poll ``GET /`` of each server until all answer 2xx, or raise ``NotReadyError``.

        The error names every server that is still not ready and why.
        """
        wanted = list(names) if names is not None else [s.name for s in self.servers()]
        missing = [n for n in wanted if n not in self._servers]
        if missing:
            raise ConfigError(f"unknown servers {missing}; known servers: {self._names()}")
        urls = {name: f"{self._servers[name].url}/" for name in wanted}
        with owned_session(session) as http:
            pending = poll_ready(urls, timeout=timeout, interval=interval, session=http)
        if pending:
            detail = "; ".join(f"{name} ({why})" for name, why in pending.items())
            raise NotReadyError(f"servers not ready after {timeout:g} s: {detail}")

    def unresponsive(
        self, *, timeout: float = 2.0, session: requests.Session | None = None
    ) -> dict[str, str]:
        """Servers that do not answer ``GET /`` within ``timeout`` seconds, each probed once
        (any HTTP answer counts; a frozen or dead server does not): name -> ``"<type>
        <url>: <why>"``, e.g. to name the server behind episodes that timed out."""
        with owned_session(session) as http:
            pending = poll_ready(
                {name: f"{s.url}/" for name, s in self._servers.items()},
                timeout=0,
                session=http,
                ready=answered,
                probe_timeout=timeout,
            )
        return {name: f"{self._servers[name].server_type} {why}" for name, why in pending.items()}


# --- head server helpers ------------------------------------------------------------------


def _fetch(http: requests.Session, url: str, timeout: float) -> requests.Response:
    return check(send(http, "GET", url, timeout=timeout), url)


def _fetch_json(http: requests.Session, url: str, timeout: float) -> Any:
    response = _fetch(http, url, timeout)
    try:
        return response.json()
    except ValueError as exc:
        raise DiscoveryError(f"{url} did not return JSON: {response.text[:200]!r}") from exc


def _head_ready(status: int) -> bool:
    """``/readyz`` answers 200 once every server is up; a head without it (404) is ready."""
    return status < 300 or status == 404


def _wait_for_head(http: requests.Session, head_url: str, timeout: float, wait: float) -> None:
    url = f"{head_url}/readyz"
    pending = poll_ready(
        {"head": url},
        timeout=wait,
        session=http,
        interval=0.5,
        ready=_head_ready,
        probe_timeout=timeout,
    )
    if pending:
        raise NotReadyError(
            f"head server {head_url} not ready after {wait:g} s ({pending['head']}). Is NeMo "
            "Gym running there? Start it with `gym env start` (NeMo Gym's launcher), or let "
            "the SDK start it: GymStack(..., head_server=True), or nemogym-train without "
            "--head-url"
        )


def _fetch_config(http: requests.Session, head_url: str, timeout: float) -> dict[str, Any]:
    """The global config: YAML text inside a JSON string (sometimes YAML directly)."""
    url = f"{head_url}/global_config_dict_yaml"
    text = _fetch(http, url, timeout).text
    value: Any = text
    for _ in range(3):  # JSON string -> YAML text -> mapping (tolerate double encoding)
        if not isinstance(value, str):
            break
        try:
            value = json.loads(value)
            continue
        except ValueError:
            pass
        try:
            value = yaml.safe_load(value)
        except yaml.YAMLError as exc:
            raise DataError(f"{url} is neither JSON nor YAML: {exc}") from exc
    if not isinstance(value, dict):
        raise DiscoveryError(f"{url} did not decode to a mapping (got {type(value).__name__})")
    return value


def _lookup(root: Mapping[str, Any], dotted: str) -> Any:
    node: Any = root
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node


def resolve_interpolations(config: dict[str, Any]) -> dict[str, Any]:
    """Resolve plain ``${a.b}`` references against the config root (others stay as text)."""

    def resolve(value: Any, depth: int = 0) -> Any:
        if isinstance(value, dict):
            return {k: resolve(v, depth) for k, v in value.items()}
        if isinstance(value, list):
            return [resolve(v, depth) for v in value]
        if not isinstance(value, str) or depth > 8:
            return value
        whole = _INTERPOLATION.fullmatch(value)
        if whole:
            target = _lookup(config, whole.group(1))
            return value if target is None else resolve(target, depth + 1)

        def substitute(match: re.Match[str]) -> str:
            target = _lookup(config, match.group(1))
            return (
                match.group(0)
                if target is None or isinstance(target, (dict, list))
                else str(target)
            )

        return _INTERPOLATION.sub(substitute, value)

    resolved = resolve(config)
    assert isinstance(resolved, dict)
    return resolved


def _server_blocks(config: Mapping[str, Any]) -> dict[str, tuple[str, str, Mapping[str, Any]]]:
    """instance name -> (server type, implementation, server config) from the global config."""
    found: dict[str, tuple[str, str, Mapping[str, Any]]] = {}
    for name, block in config.items():
        if not isinstance(block, Mapping):
            continue
        for server_type in SERVER_TYPES:
            inner = block.get(server_type)
            if isinstance(inner, Mapping):
                for implementation, server_config in inner.items():
                    if isinstance(server_config, Mapping):
                        found[str(name)] = (server_type, str(implementation), server_config)
    return found


def _servers_from(
    config: Mapping[str, Any], instances: list[Any], head_host: str
) -> list[ServerInfo]:
    """Servers from the head's answers: addresses from ``/server_instances`` (what really
    runs), falling back to the config's ``host``/``port``; kinds and configs from the
    global config, falling back to the instance entry."""
    blocks = _server_blocks(config)
    addresses: dict[str, tuple[Any, Any]] = {
        name: (server_config.get(HOST, "127.0.0.1"), server_config.get(PORT))
        for name, (_, _, server_config) in blocks.items()
    }
    for entry in instances:
        instance = decode_server_instance(entry)
        if instance is not None:
            addresses[instance.name] = (instance.host, instance.port)
            blocks.setdefault(instance.name, (instance.server_type, instance.implementation, {}))
    return [
        ServerInfo(
            name=name,
            server_type=server_type,
            implementation=implementation,
            url=base_url(routable_host(host, head_host), default_port=port),
            config=server_config,
        )
        for name, (server_type, implementation, server_config) in blocks.items()
        for host, port in [addresses[name]]
        if isinstance(host, str) and isinstance(port, int)
    ]
