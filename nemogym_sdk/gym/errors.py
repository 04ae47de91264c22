"""Errors raised while locating the NeMo Gym venv and preparing its servers.

They extend the package-wide tree in :mod:`nemogym_sdk.errors`::

    ConfigError(ValueError)
    ├── GymVenvNotFoundError           the NeMo Gym venv is missing or incomplete
    ├── UvNotFoundError                ``uv`` (which builds per-server environments) is absent
    ├── DatasetMissingError            a config names example rows that are not there
    └── ServerDirectoryMissingError    a config runs a server from a directory that is not there
    ServerStartError(RuntimeError)     (nemogym_sdk.processes.errors)
    └── RequirementsInstallError       a server's requirements failed to install

``ServerStartError`` and ``ServerNotReadyError`` (any local server process: NeMo Gym's,
vLLM, the router) live in :mod:`nemogym_sdk.processes.errors` and are re-exported here.
:class:`RequirementsInstallError` carries the tail of uv's output, so a failed install can
be diagnosed from the exception message alone.
"""

from __future__ import annotations

from pathlib import Path

from nemogym_sdk.errors import ConfigError, NemoGymError
from nemogym_sdk.processes.errors import ServerNotReadyError, ServerStartError

__all__ = [
    "DatasetMissingError",
    "GymVenvNotFoundError",
    "RequirementsInstallError",
    "ServerNotReadyError",
    "ServerDirectoryMissingError",
    "ServerStartError",
    "UvNotFoundError",
]


class GymVenvNotFoundError(ConfigError):
    """The Python 3.13 venv holding nemo-gym is missing or does not contain NeMo Gym."""


class UvNotFoundError(ConfigError):
    """No ``uv`` to build a server's environment with (``pip install uv`` fixes it)."""


class DatasetMissingError(ConfigError):
    """An environment's config names example rows that do not exist: a file the installed
    nemo-gym does not ship (``structured_outputs:structured_outputs_json_yaml_xml_v1``).

    ``environment`` is the environment, ``config_path`` its config, ``path`` the file.
    """

    def __init__(self, environment: str, config_path: Path, path: Path) -> None:
        super().__init__(
            f"{environment}: its config {config_path} names the example rows {path}, which "
            "is not there (the installed nemo-gym does not ship it); pick another of the "
            "environment's configs"
        )
        self.environment = environment
        self.config_path = config_path
        self.path = path

    def __reduce__(self) -> tuple[type[DatasetMissingError], tuple[object, ...]]:
        return (type(self), (self.environment, self.config_path, self.path))


class ServerDirectoryMissingError(ConfigError):
    """An environment's config runs a server from a directory the installed nemo-gym does
    not have (``ns_tools:ns_tools_periodictable`` names ``resources_servers/
    ns_tools_periodictable``; the server's code is in ``resources_servers/ns_tools``).

    ``environment`` is the environment, ``config_path`` its config, ``server`` the server's
    ``server_type/impl``, ``directory`` where it would run.
    """

    def __init__(
        self, environment: str, config_path: Path | None, server: str, directory: Path
    ) -> None:
        named = f"its config {config_path}" if config_path is not None else "its config"
        super().__init__(
            f"{environment}: {named} runs the server {server}, but {directory} does not "
            "exist (the installed nemo-gym has no such server directory); pick another of "
            "the environment's configs, or point the server at a directory that holds its "
            "code"
        )
        self.environment = environment
        self.config_path = config_path
        self.server = server
        self.directory = directory

    def __reduce__(self) -> tuple[type[ServerDirectoryMissingError], tuple[object, ...]]:
        return (type(self), (self.environment, self.config_path, self.server, self.directory))


class RequirementsInstallError(ServerStartError):
    """Installing a server's requirements into its environment failed.

    ``server`` is the server directory (``resources_servers/math_with_judge``),
    ``requirements_path`` the file its requirements came from, ``returncode`` uv's exit
    status, ``log_path`` the install log and ``log_tail`` the last lines of uv's output.
    """

    def __init__(
        self,
        server: str,
        requirements_path: Path,
        returncode: int | None,
        log_path: Path | None,
        log_tail: str,
    ) -> None:
        where = f" (log: {log_path})" if log_path is not None else ""
        tail = log_tail.rstrip() or "<no output>"
        NemoGymError.__init__(
            self,
            f"installing the requirements of NeMo Gym server {server!r} from "
            f"{requirements_path} failed with status {returncode}{where}. "
            f"Last lines of uv's output:\n{tail}",
        )
        self.server = server
        self.requirements_path = requirements_path
        self.returncode = returncode
        self.log_path = log_path
        self.log_tail = log_tail

    def __reduce__(self) -> tuple[type[ServerStartError], tuple[object, ...]]:
        return (
            type(self),
            (self.server, self.requirements_path, self.returncode, self.log_path, self.log_tail),
        )
