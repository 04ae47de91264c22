"""The head server's ``/server_instances`` entries."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from nemogym_sdk.wire.names import CONFIG_PATH, HOST, NAME, PORT, PROCESS_NAME, SERVER_TYPE

__all__ = ["ServerInstance", "decode_server_instance", "encode_server_instance"]


class ServerInstance(NamedTuple):
    """One entry of the head server's ``/server_instances``."""

    name: str
    """Instance name (``process_name``, else ``config_path``)."""
    server_type: str
    """``server_type`` as reported."""
    implementation: str
    """``name``: the implementation directory."""
    host: str
    """``host`` it listens on (maybe a wildcard or loopback address)."""
    port: int
    """``port`` it listens on."""


def encode_server_instance(
    instance: ServerInstance, *, url: str, dir_path: str, entrypoint: str, pid: int, started: float
) -> dict[str, Any]:
    """One ``/server_instances`` entry as NeMo Gym's head server lists it
    (``ServerInstanceDisplayConfig``): what a stack the SDK started reports."""
    return {
        PROCESS_NAME: instance.name,
        SERVER_TYPE: instance.server_type,
        NAME: instance.implementation,
        "dir_path": dir_path,
        "entrypoint": entrypoint,
        HOST: instance.host,
        PORT: instance.port,
        "url": url,
        "pid": pid,
        CONFIG_PATH: instance.name,
        "start_time": started,
    }


def decode_server_instance(entry: Any) -> ServerInstance | None:
    """One ``/server_instances`` entry, or None when it lacks a name, host or port."""
    if not isinstance(entry, Mapping):
        return None
    name = entry.get(PROCESS_NAME) or entry.get(CONFIG_PATH)
    host, port = entry.get(HOST), entry.get(PORT)
    if not (isinstance(name, str) and isinstance(host, str) and isinstance(port, int)):
        return None
    return ServerInstance(
        name=name,
        server_type=str(entry.get(SERVER_TYPE)),
        implementation=str(entry.get(NAME)),
        host=host,
        port=port,
    )
