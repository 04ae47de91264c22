"""A loopback NeMo Gym head server describing a deployment of (fake or real) servers.

``head_server`` answers ``/global_config_dict_yaml`` (YAML inside a JSON string),
``/server_instances`` and ``/readyz`` like NeMo Gym's head, for agents and resources servers
whose URLs the test chooses (usually ``tests.fakes`` servers), plus one model server that
requests ``model_name`` from ``sampler_url``. ``recorder`` is a server that records every
request it gets, whatever the path.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit

from aiohttp import web

from tests import fakes
from tests.fakes import FakeServer, serve


def _host_port(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    return parts.hostname or "127.0.0.1", int(parts.port or 80)


@contextmanager
def head_server(
    agents: Mapping[str, str],
    resources: Mapping[str, str] | None = None,
    *,
    model_name: str = "policy",
    sampler_url: str = "http://127.0.0.1:8000/v1",
    agent_resources: Mapping[str, str] | None = None,
) -> Iterator[FakeServer]:
    """A head server for agents (name -> URL), resources servers and one model server."""
    config: dict[str, Any] = {
        "policy_model": {
            "responses_api_models": {
                "vllm_model": {
                    "host": "127.0.0.1",
                    "port": 1,
                    "base_url": sampler_url,
                    "model": model_name,
                }
            }
        }
    }
    instances = [
        {
            "process_name": "policy_model",
            "server_type": "responses_api_models",
            "host": "127.0.0.1",
            "port": 1,
        }
    ]
    for kind, servers in (("responses_api_agents", agents), ("resources_servers", resources or {})):
        for name, url in servers.items():
            host, port = _host_port(url)
            inner: dict[str, Any] = {"host": host, "port": port}
            if kind == "responses_api_agents" and agent_resources and name in agent_resources:
                inner["resources_server"] = {
                    "type": "resources_servers",
                    "name": agent_resources[name],
                }
            config[name] = {kind: {"impl": inner}}
            instances.append(
                {"process_name": name, "server_type": kind, "host": host, "port": port}
            )

    with fakes.head_server(config, instances) as server:
        yield server


@contextmanager
def recorder() -> Iterator[FakeServer]:
    """A server that answers 200 to anything and counts every request by path."""

    def routes(server: FakeServer) -> list[web.RouteDef]:
        async def anything(request: web.Request) -> web.Response:
            with server.lock:
                server.paths[request.path] += 1
            return web.json_response({})

        return [web.route("*", "/{tail:.*}", anything)]

    with serve(routes) as server:
        yield server
