"""The config side of a stack: what to start, and how each server process is run.

:class:`StackBuilder` holds everything a stack is made of (the environments, the policy
and judge, overrides, data files, per-server requirements) and nothing that runs.
:meth:`StackBuilder.build` resolves the global config (:func:`~nemogym_sdk.gym.config.
build_stack_config`) and checks that the example rows it names exist;
:meth:`StackBuilder.launch` turns it into one :class:`~nemogym_sdk.processes.ProcessSpec`
per server: the directory it runs in (the venv's, the SDK's, or an overlay with extra data
files), its interpreter (the NeMo Gym venv's, or a per-server venv with its requirements)
and its environment. :class:`~nemogym_sdk.gym.stack.GymStack` starts those as a
:class:`~nemogym_sdk.processes.ProcessGroup`.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from nemogym_sdk.errors import ConfigError
from nemogym_sdk.gym.catalog import missing_data_files
from nemogym_sdk.gym.config import build_stack_config
from nemogym_sdk.gym.errors import (
    DatasetMissingError,
    ServerDirectoryMissingError,
    UvNotFoundError,
)
from nemogym_sdk.gym.locate import GymVenv, locate_environment, split_environment_name
from nemogym_sdk.gym.overlay import FileSource, make_overlay
from nemogym_sdk.gym.server_envs import ServerEnvironment, find_uv, prepare_server_environment
from nemogym_sdk.gym.specs import (
    ENVIRONMENT_SERVERS,
    RESOURCES,
    PolicyModel,
    ServerSpec,
    StackConfig,
)
from nemogym_sdk.processes import ProcessSpec
from nemogym_sdk.wire import ServerInstance, encode_server_instance

__all__ = ["HEAD_SERVER_NAME", "Launch", "StackBuilder", "child_env"]

logger = logging.getLogger(__name__)

HEAD_SERVER_NAME = "head_server"
"""Name of the head-server process in :attr:`GymStack.log_paths` and :attr:`GymStack.pids`."""

_HEAD_MAIN = Path(__file__).with_name("head_main.py")
_RELAY_MAIN = Path(__file__).with_name("relay_main.py")
_RELAY = "legacy_agent"
"""The environment server a stack can start (without Ray): NeMo Gym's ``/run`` relay."""
GYM_PRELOAD = (
    "nemo_gym.server_utils",
    "nemo_gym.base_resources_server",
    "nemo_gym.base_responses_api_agent",
    "nemo_gym.base_responses_api_model",
)
"""What every NeMo Gym server imports first (~2.5 s of CPU): servers that run on the NeMo
Gym venv's interpreter are forked from a process that imported it once
(`nemogym_sdk.processes.forkserver`; ``NEMOGYM_FORK_SERVERS=0``: a new interpreter each)."""
PYCACHE_DIR = "pycache"
"""Where, inside a per-server venv, its server's compiled bytecode goes."""
# Variables of the SDK's own interpreter that must not leak into the 3.13 venv.
_SCRUBBED_ENV = ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "VIRTUAL_ENV", "__PYVENV_LAUNCHER__")


@attrs.frozen(kw_only=True)
class Launch:
    """How the servers of one stack are run."""

    processes: tuple[ProcessSpec, ...]
    """One per server, in start order (models, resources servers, agents)."""
    server_dirs: Mapping[str, Path]
    """``server_type/impl`` -> the directory it runs in (overlay, venv or SDK)."""
    server_envs: Mapping[str, ServerEnvironment]
    """``server_type/impl`` -> the interpreter it runs with."""
    base_env: Mapping[str, str] = attrs.field(repr=False)
    """The environment every process starts from (the config in ``NEMO_GYM_CONFIG_DICT``)."""


@attrs.frozen(kw_only=True)
class StackBuilder:
    """Everything a stack is made of; see :class:`~nemogym_sdk.gym.stack.GymStack` for
    what each setting means."""

    venv: GymVenv
    environments: tuple[str, ...]
    model: PolicyModel
    judge: PolicyModel | None = None
    default_max_steps: int | None = None
    overrides: Mapping[str, Any] = attrs.field(factory=dict)
    server_files: Mapping[str, Mapping[str, FileSource]] = attrs.field(factory=dict)
    install_requirements: bool = True
    requirements_cache: Path | None = None
    extra_env: Mapping[str, str] = attrs.field(factory=dict)
    environment_servers: bool = False
    env_path: tuple[Path, ...] = ()
    """The environment search path, resolved (``GymStack`` reads ``$NEMOGYM_ENV_PATH`` when
    given none; see :func:`~nemogym_sdk.gym.locate.environment_path`)."""

    def build(self, workdir: Path) -> StackConfig:
        """The resolved config; :class:`~nemogym_sdk.gym.errors.DatasetMissingError` when
        an environment's example rows are not there (its config names a file the installed
        NeMo Gym does not ship)."""
        config = build_stack_config(
            self.venv,
            self.environments,
            self.model,
            judge=self.judge,
            workdir=workdir,
            default_max_steps=self.default_max_steps,
            overrides=self.overrides,
            environment_servers=self.environment_servers,
            env_path=self.env_path,
        )
        for spec in config.servers:
            if spec.server_type == ENVIRONMENT_SERVERS and spec.impl != _RELAY:
                raise ConfigError(
                    f"{spec.instance}: the stack starts NeMo Gym's {_RELAY} environment "
                    f"server only, not {spec.impl}"
                )
        for setup in config.environments:
            if not setup.example_path.is_file():
                raise DatasetMissingError(setup.name, setup.config_path, setup.example_path)
        for spec in config.servers:
            directory = self._server_dir(spec)
            if directory is not None and not directory.is_dir():
                setups = [e for e in config.environments if e.name == spec.environment]
                config_path = setups[0].config_path if setups else None
                where = spec.environment or spec.instance
                raise ServerDirectoryMissingError(where, config_path, _key(spec), directory)
        return config

    def _server_dir(self, spec: ServerSpec) -> Path | None:
        """Where ``spec``'s code is (its overlay starts from it); None for the relay, which
        runs from the SDK."""
        if spec.server_type == ENVIRONMENT_SERVERS:
            return None
        if spec.server_type == RESOURCES:
            return locate_environment(self.venv, spec.impl, self.env_path).directory
        return self.venv.server_dir(spec.server_type, spec.impl)

    def launch(self, config: StackConfig, workdir: Path) -> Launch:
        """One process per server of ``config``; overlays go under ``workdir/servers``,
        logs under ``workdir/logs``. Builds per-server venvs that are not cached yet."""
        base_env = child_env(self.venv, config.to_yaml(), self.extra_env)
        dirs = self._server_dirs(config, workdir)
        envs = self._interpreters(config, dirs, base_env)
        processes = []
        for spec in config.servers:
            key = _key(spec)
            relay = spec.server_type == ENVIRONMENT_SERVERS  # NeMo Gym's relay, without Ray
            entrypoint = ("-P", str(_RELAY_MAIN)) if relay else (spec.entrypoint,)
            processes.append(
                ProcessSpec(
                    name=spec.instance,
                    argv=(str(envs[key].python), *entrypoint),
                    cwd=dirs[key],
                    env={
                        **base_env,
                        **_venv_env(base_env, envs[key].root),
                        "NEMO_GYM_CONFIG_PATH": spec.instance,
                        "PYTHONPATH": str(dirs[key]),
                    },
                    log_path=workdir / "logs" / f"{_file_safe(spec.instance)}.log",
                    health_url=f"{spec.url}/",
                    preload=GYM_PRELOAD if envs[key].root is None else (),
                )
            )
        return Launch(
            processes=tuple(processes), server_dirs=dirs, server_envs=envs, base_env=base_env
        )

    def head_process(
        self, config: StackConfig, workdir: Path, launch: Launch, pids: Mapping[str, int]
    ) -> ProcessSpec:
        """NeMo Gym's head server for the started servers (``pids``: instance -> pid),
        listing them as ``gym env start`` does (``<workdir>/server_instances.json``)."""
        now = time.time()
        instances = [
            encode_server_instance(
                ServerInstance(
                    name=spec.instance,
                    server_type=spec.server_type,
                    implementation=spec.impl,
                    host=spec.host,
                    port=spec.port,
                ),
                url=spec.url,
                dir_path=str(launch.server_dirs[_key(spec)]),
                entrypoint=spec.entrypoint,
                pid=pids[spec.instance],
                started=now,
            )
            for spec in config.servers
        ]
        path = workdir / "server_instances.json"
        path.write_text(json.dumps(instances, indent=1))
        return ProcessSpec(
            name=HEAD_SERVER_NAME,
            argv=(str(self.venv.python), "-P", str(_HEAD_MAIN), str(path)),
            cwd=workdir,
            env=launch.base_env,
            log_path=workdir / "logs" / f"{HEAD_SERVER_NAME}.log",
            health_url=f"http://{config.head_host}:{config.head_port}/readyz",
            preload=GYM_PRELOAD,
        )

    def _files(self) -> dict[str, dict[str, FileSource]]:
        """``server_type/impl`` -> extra data files: ``server_files``, plus stand-ins for
        data files an environment needs that the wheel does not ship."""
        files = {key: dict(extra) for key, extra in self.server_files.items()}
        for environment in self.environments:
            directory, _ = split_environment_name(environment)
            given = files.setdefault(f"{RESOURCES}/{directory}", {})
            stand_ins = {
                path: text
                for path, text in missing_data_files(
                    self.venv, directory, env_path=self.env_path
                ).items()
                if path not in given
            }
            if stand_ins:
                logger.warning(
                    "%s: the NeMo Gym wheel lacks %s; using a stand-in (docs/gym-environments.md)",
                    environment,
                    ", ".join(stand_ins),
                )
                given.update(stand_ins)
            if not given:
                del files[f"{RESOURCES}/{directory}"]
        return files

    def _server_dirs(self, config: StackConfig, workdir: Path) -> dict[str, Path]:
        """``server_type/impl`` -> the directory each server runs in (overlay, venv or SDK)."""
        files = self._files()
        dirs: dict[str, Path] = {}
        for spec in config.servers:
            key = _key(spec)
            if key in dirs:
                continue
            original = self._server_dir(spec) or self.venv.server_dir(spec.server_type, spec.impl)
            if key in files:
                dirs[key] = make_overlay(original, workdir / "servers" / key, files.pop(key))
            else:
                dirs[key] = original
        if files:
            raise ConfigError(f"server_files for servers the stack does not run: {sorted(files)}")
        return dirs

    def _interpreters(
        self, config: StackConfig, dirs: Mapping[str, Path], base_env: Mapping[str, str]
    ) -> dict[str, ServerEnvironment]:
        """Each server's interpreter, its requirements installed first when enabled."""
        envs: dict[str, ServerEnvironment] = {}
        for spec in config.servers:
            key = _key(spec)
            if key in envs:
                continue
            if not self.install_requirements:
                envs[key] = ServerEnvironment(
                    server=key, python=self.venv.python, root=None, reused=True
                )
                continue
            envs[key] = prepare_server_environment(
                self.venv,
                spec.server_type,
                spec.impl,
                server_dir=dirs[key],
                cache_root=self.requirements_cache,
                env=base_env,
            )
        return envs


def child_env(venv: GymVenv, config_text: str, extra_env: Mapping[str, str]) -> dict[str, str]:
    """The environment every server process starts from: this process's, without the SDK
    interpreter's variables and stale ``NEMO_GYM_*``, the venv and uv first on ``PATH``,
    no bytecode written, loopback never proxied, ``extra_env``, and the config."""
    env = {k: v for k, v in os.environ.items() if k not in _SCRUBBED_ENV}
    env = {k: v for k, v in env.items() if not k.startswith("NEMO_GYM_")}
    bin_dirs = [str(venv.python.parent), *_uv_dir()]
    env["PATH"] = os.pathsep.join([*bin_dirs, env.get("PATH", "")])
    env["VIRTUAL_ENV"] = str(venv.root)
    env["PYTHONUNBUFFERED"] = "1"
    # Never write __pycache__ into the venv or the SDK's package (envs/<name>/rules.py).
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    no_proxy = ",".join(filter(None, [env.get("NO_PROXY", ""), "127.0.0.1,localhost"]))
    env["NO_PROXY"] = env["no_proxy"] = no_proxy
    env.update(extra_env)
    env["NEMO_GYM_CONFIG_DICT"] = config_text
    return env


def _key(spec: ServerSpec) -> str:
    return f"{spec.server_type}/{spec.impl}"


def _uv_dir() -> list[str]:
    """The directory of the ``uv`` executable the SDK uses, if any: NeMo Gym's launcher has
    uv on its servers' PATH, and some servers run it at start-up (bigcodebench builds its
    sandbox venv with it)."""
    try:
        command = find_uv()
    except UvNotFoundError:
        return []
    return [str(Path(command[0]).parent)] if len(command) == 1 else []


def _venv_env(base_env: Mapping[str, str], venv_root: Path | None) -> dict[str, str]:
    """``VIRTUAL_ENV`` and ``PATH`` of a server running in its own venv (none: no change).

    Such a venv is the SDK's cache, built by uv without bytecode; its server keeps the
    bytecode it compiles under the venv (``PYTHONPYCACHEPREFIX``, so still nothing is
    written beside the NeMo Gym venv's or the SDK's sources). A math_with_judge server's
    imports then take ~3 s of CPU from its second start on, against ~8 s compiled afresh
    at every start."""
    if venv_root is None:
        return {}
    path = base_env.get("PATH", "")
    return {
        "VIRTUAL_ENV": str(venv_root),
        "PATH": os.pathsep.join([str(venv_root / "bin"), path]),
        "PYTHONDONTWRITEBYTECODE": "",  # empty: unset for Python
        "PYTHONPYCACHEPREFIX": str(venv_root / PYCACHE_DIR),
    }


def _file_safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
