"""``GymStack``: real NeMo Gym servers for shipped environments, started and stopped locally.

Manual mode (default) starts each server the way ``gym env start`` would, minus Ray
and the head server: ``<gym venv>/bin/python app.py`` in the server's directory, with
the whole resolved config in ``NEMO_GYM_CONFIG_DICT`` and the server's instance name in
``NEMO_GYM_CONFIG_PATH``. Environments shipped with the SDK (``nemogym_sdk/gym/envs``,
e.g. ``target_chars``) run the same way from their directory in the SDK, with the venv's
interpreter. Servers run with ``PYTHONDONTWRITEBYTECODE=1``, so neither the venv nor the
SDK's package directory is ever written to. A server whose directory lists requirements
beyond nemo-gym (``requirements.txt``, e.g. ``math-verify`` for ``math_with_judge``) runs
with the interpreter of a venv of its own, built with uv on first use and cached (see
:mod:`nemogym_sdk.gym.requirements`). Head-server mode adds NeMo Gym's own
``HeadServer`` in a small process of its own (see :mod:`nemogym_sdk.gym.head_main`), so
clients can discover the servers through ``GET /server_instances`` and
``GET /global_config_dict_yaml``.

Example::

    model = PolicyModel(base_url="http://127.0.0.1:8000/v1", model="tiny")
    with GymStack(["example_single_tool_call"], model) as stack:
        url = stack.agent_url("example_single_tool_call")   # POST {url}/run
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from nemogym_sdk.data import read_rows
from nemogym_sdk.directory import ServerDirectory, ServerInfo
from nemogym_sdk.errors import ConfigError
from nemogym_sdk.gym.catalog import missing_data_files
from nemogym_sdk.gym.config import build_stack_config
from nemogym_sdk.gym.errors import UvNotFoundError
from nemogym_sdk.gym.locate import (
    GymVenv,
    find_gym_venv,
    locate_environment,
    split_environment_name,
)
from nemogym_sdk.gym.overlay import FileSource, make_overlay
from nemogym_sdk.gym.process import ServerProcess, spawn, stop_all, wait_answering, wait_ready
from nemogym_sdk.gym.requirements import ServerEnvironment, find_uv, prepare_server_environment
from nemogym_sdk.gym.specs import (
    AGENTS,
    MODELS,
    RESOURCES,
    EnvironmentSetup,
    PolicyModel,
    StackConfig,
)
from nemogym_sdk.records import TaskRow
from nemogym_sdk.wire import ServerInstance, encode_server_instance

__all__ = ["HEAD_SERVER_NAME", "GymStack"]

logger = logging.getLogger(__name__)

HEAD_SERVER_NAME = "head_server"
"""Name of the head-server process in :attr:`GymStack.log_paths` and :attr:`GymStack.pids`."""

_HEAD_MAIN = Path(__file__).with_name("head_main.py")
# Variables of the SDK's own interpreter that must not leak into the 3.13 venv.
_SCRUBBED_ENV = ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "VIRTUAL_ENV", "__PYVENV_LAUNCHER__")


class GymStack:
    """A set of real NeMo Gym servers for some shipped environments, on loopback ports.

    Nothing starts until :meth:`start` (or ``with``). All servers bind 127.0.0.1 on
    free ports picked at start. Logs go to ``<workdir>/logs/<instance>.log`` and stay
    there after :meth:`stop`; the resolved config is written to
    ``<workdir>/config.yaml``.

    Args:
        environments: environment names, e.g. ``["example_single_tool_call"]``: NeMo Gym's
            (``resources_servers/<name>`` in the venv) or the SDK's own
            (:data:`~nemogym_sdk.gym.SDK_ENVIRONMENTS`, e.g. ``"target_chars"``), or
            ``"<directory>:<config>"`` for another of its configs. One whose config starts
            no agent runs with the agent its ``allowed_agents`` names (``gdpval``: see
            :mod:`~nemogym_sdk.gym.loading`).
        model: the OpenAI-compatible backend, served to the agents as ``policy_model``.
        judge: the OpenAI-compatible endpoint (``base_url``, ``model``: the served model
            name, ``api_key``) that every other model server the environments call is
            pointed at: judges, user simulators, reward models (see "Judges and other model
            servers" in ``docs/gym-environments.md``). Default: ``model``'s backend; then
            environments whose judge is ``policy_model`` keep judging on the policy's server.
        head_server: also run NeMo Gym's head server (discovery endpoints).
        venv: the NeMo Gym venv (a :class:`GymVenv` or a path); default
            ``$NEMOGYM_GYM_VENV`` or ``<repo>/.venv-gym``.
        workdir: where logs and the config go; default a fresh temporary directory.
        ready_timeout: seconds for all servers to answer their health route.
        backend_timeout: if set, seconds to wait, before starting anything, for the
            backend to answer ``GET {base_url}/models`` (any status counts, like
            ``gym env start``'s check), and for ``judge``'s when it is elsewhere. NeMo
            Gym does not check it, and a ``/run`` against a dead backend hangs (the
            model server retries forever).
        stop_grace: seconds between SIGTERM and SIGKILL on stop.
        default_max_steps: ``max_steps`` for agents whose config sets none.
        overrides: deep-merged into the global config last (see
            :func:`~nemogym_sdk.gym.config.build_stack_config`).
        extra_env: extra environment variables for every server process.
        server_files: extra data files per server directory, e.g.
            ``{"resources_servers/wordle": {"data/guesses.txt": Path("guesses.txt")}}``
            (a ``str`` value is the file's text). The server then runs from a symlinked
            copy of its directory under ``<workdir>/servers`` (see
            :mod:`~nemogym_sdk.gym.overlay`); the venv is never written to. Data files the
            wheel does not ship get a stand-in automatically (see
            :func:`~nemogym_sdk.gym.catalog.missing_data_files`).
        install_requirements: give each server whose directory needs more than nemo-gym
            (its ``requirements.txt`` or ``pyproject.toml``) a venv of its own, built with
            uv and cached (:mod:`~nemogym_sdk.gym.requirements`); ``False`` runs every
            server in ``venv`` as it is (for users who manage that venv themselves).
        requirements_cache: where those venvs are cached; default ``$NEMOGYM_SERVER_ENVS``,
            else ``$XDG_CACHE_HOME/nemogym_sdk/server-envs``.
    """

    def __init__(
        self,
        environments: Sequence[str],
        model: PolicyModel,
        *,
        head_server: bool = False,
        judge: PolicyModel | None = None,
        venv: GymVenv | str | os.PathLike[str] | None = None,
        workdir: str | os.PathLike[str] | None = None,
        ready_timeout: float = 120.0,
        backend_timeout: float | None = None,
        stop_grace: float = 5.0,
        default_max_steps: int | None = None,
        overrides: Mapping[str, Any] | None = None,
        extra_env: Mapping[str, str] | None = None,
        server_files: Mapping[str, Mapping[str, FileSource]] | None = None,
        install_requirements: bool = True,
        requirements_cache: str | os.PathLike[str] | None = None,
    ) -> None:
        if isinstance(environments, str):
            raise ConfigError("environments must be a sequence of names, not a string")
        self._environments = tuple(environments)
        self._model = model
        self._judge = judge
        self._head_server = head_server
        self._venv = venv if isinstance(venv, GymVenv) else find_gym_venv(venv)
        self._workdir_arg = Path(workdir) if workdir is not None else None
        self._ready_timeout = ready_timeout
        self._backend_timeout = backend_timeout
        self._stop_grace = stop_grace
        self._default_max_steps = default_max_steps
        self._overrides = overrides
        self._extra_env = dict(extra_env or {})
        self._server_files = {key: dict(files) for key, files in (server_files or {}).items()}
        self._install_requirements = install_requirements
        self._requirements_cache = requirements_cache
        self._server_envs: dict[str, ServerEnvironment] = {}
        self._workdir: Path | None = None
        self._config: StackConfig | None = None
        self._processes: list[ServerProcess] = []
        self._dirs: dict[str, Path] = {}
        self._started = False
        self._running = False

    # ----------------------------------------------------------------- lifecycle

    def start(self) -> GymStack:
        """Start every server and wait until all are ready; returns ``self``.

        On any failure (bad config, a server exiting, the deadline) everything started so
        far is stopped before the error propagates. A stack starts once.
        """
        if self._started:
            raise RuntimeError("GymStack.start() was already called; create a new GymStack")
        self._started = True
        began = time.monotonic()
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        logger.info(
            "NeMo Gym stack ready in %.1f s: %d processes, workdir %s",
            time.monotonic() - began,
            len(self._processes),
            self._workdir,
        )
        return self

    def _start(self) -> None:
        if self._workdir_arg is not None:
            self._workdir = self._workdir_arg.resolve()
            self._workdir.mkdir(parents=True, exist_ok=True)
        else:
            self._workdir = Path(tempfile.mkdtemp(prefix="nemogym-gym-"))
        self._config = build_stack_config(
            self._venv,
            self._environments,
            self._model,
            judge=self._judge,
            workdir=self._workdir,
            default_max_steps=self._default_max_steps,
            overrides=self._overrides,
        )
        if self._backend_timeout is not None:
            models_url = f"{self._model.base_url.rstrip('/')}/models"
            wait_answering(
                f"backend of {self._model.instance_name}", models_url, self._backend_timeout
            )
            if self._judge is not None and self._judge.base_url != self._model.base_url:
                judge_url = f"{self._judge.base_url.rstrip('/')}/models"
                wait_answering("judge endpoint", judge_url, self._backend_timeout)
        config_text = self._config.to_yaml()
        (self._workdir / "config.yaml").write_text(config_text)
        atexit.register(self.stop)
        self._running = True
        base_env = self._child_env(config_text)
        server_dirs = self._server_dirs()
        server_envs = self._prepare_server_envs(base_env)
        logs = self._workdir / "logs"
        for spec in self._config.servers:
            key = f"{spec.server_type}/{spec.impl}"
            server_dir = server_dirs[key]
            server_env = server_envs[key]
            self._processes.append(
                spawn(
                    spec.instance,
                    [str(server_env.python), spec.entrypoint],
                    cwd=server_dir,
                    env={
                        **base_env,
                        **_venv_env(base_env, server_env.root),
                        "NEMO_GYM_CONFIG_PATH": spec.instance,
                        "PYTHONPATH": str(server_dir),
                    },
                    log_path=logs / f"{_file_safe(spec.instance)}.log",
                    health_url=f"{spec.url}/",
                )
            )
        if self._head_server:
            instances_path = self._workdir / "server_instances.json"
            instances_path.write_text(json.dumps(self._server_instances(), indent=1))
            self._processes.append(
                spawn(
                    HEAD_SERVER_NAME,
                    [str(self._venv.python), "-P", str(_HEAD_MAIN), str(instances_path)],
                    cwd=self._workdir,
                    env=base_env,
                    log_path=logs / f"{HEAD_SERVER_NAME}.log",
                    health_url=f"{self._head_url()}/readyz",
                )
            )
        wait_ready(self._processes, self._ready_timeout)

    def stop(self) -> None:
        """Stop every process group (SIGTERM, then SIGKILL after the grace period).

        Idempotent; also runs at interpreter exit if the stack is still running.
        Logs and the config stay in :attr:`workdir`.
        """
        if not self._running:
            return
        self._running = False
        atexit.unregister(self.stop)
        # Agents first (they call the others), the head server last.
        stop_all(list(reversed(self._processes)), self._stop_grace)
        logger.info("NeMo Gym stack stopped; logs in %s", self._workdir)

    def __enter__(self) -> GymStack:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "running" if self._running else ("stopped" if self._started else "not started")
        mode = "head-server" if self._head_server else "manual"
        return f"GymStack({list(self._environments)!r}, {mode} mode, {state})"

    # ---------------------------------------------------------------- properties

    @property
    def is_running(self) -> bool:
        """Whether the stack has been started and not stopped."""
        return self._running

    @property
    def venv(self) -> GymVenv:
        """The NeMo Gym venv the servers run in."""
        return self._venv

    @property
    def server_environments(self) -> dict[str, ServerEnvironment]:
        """``server_type/impl`` -> the interpreter it runs with (its own venv or ``venv``'s).

        Filled by :meth:`start`; ``reused`` tells whether a cached venv was used.
        """
        return dict(self._server_envs)

    @property
    def workdir(self) -> Path:
        """Directory holding ``config.yaml`` and ``logs/`` (exists once started)."""
        if self._workdir is None:
            raise RuntimeError("the stack has not been started")
        return self._workdir

    @property
    def config(self) -> StackConfig:
        """The resolved config the servers were started with."""
        if self._config is None:
            raise RuntimeError("the stack has not been started")
        return self._config

    @property
    def config_path(self) -> Path:
        """``<workdir>/config.yaml``: the exact YAML every server received."""
        return self.workdir / "config.yaml"

    @property
    def environments(self) -> tuple[EnvironmentSetup, ...]:
        """What each environment contributed (agents, resources servers, example data)."""
        return self.config.environments

    @property
    def agent_urls(self) -> dict[str, str]:
        """Agent instance name -> base URL (``POST {url}/run``)."""
        return {s.instance: s.url for s in self.config.servers if s.server_type == AGENTS}

    @property
    def resources_urls(self) -> dict[str, str]:
        """Resources server instance name -> base URL (``/seed_session``, ``/verify``, tools)."""
        return {s.instance: s.url for s in self.config.servers if s.server_type == RESOURCES}

    @property
    def model_urls(self) -> dict[str, str]:
        """Model server instance name -> base URL of NeMo Gym's model server (not the backend)."""
        return {s.instance: s.url for s in self.config.servers if s.server_type == MODELS}

    @property
    def head_url(self) -> str | None:
        """``http://127.0.0.1:<port>`` of the head server; ``None`` in manual mode."""
        return self._head_url() if self._head_server else None

    @property
    def log_paths(self) -> dict[str, Path]:
        """Instance name (and ``head_server``) -> log file."""
        return {p.name: p.log_path for p in self._processes}

    @property
    def pids(self) -> dict[str, int]:
        """Instance name (and ``head_server``) -> pid, which is also its process-group id."""
        return {p.name: p.pid for p in self._processes}

    @property
    def example_paths(self) -> dict[str, Path]:
        """Environment name -> its shipped example rows (``data/example.jsonl``)."""
        return {e.name: e.example_path for e in self.config.environments}

    @property
    def train_paths(self) -> dict[str, Path]:
        """Environment name -> its ``train`` dataset, for environments whose config lists one.

        The path is resolved but may not exist: many NeMo Gym environments download theirs.
        """
        return {e.name: e.train_path for e in self.config.environments if e.train_path is not None}

    @property
    def default_agents(self) -> dict[str, str]:
        """Environment name -> the agent instance its rows go to."""
        return {e.name: e.agents[0] for e in self.config.environments if e.agents}

    # ------------------------------------------------------------------- helpers

    def agent_url(self, name: str) -> str:
        """Base URL of an agent, by agent instance name or by environment name."""
        urls = self.agent_urls
        if name in urls:
            return urls[name]
        agent = self.default_agents.get(name)
        if agent is None:
            raise ConfigError(f"{name!r} is neither an agent nor an environment of this stack")
        return urls[agent]

    def example_rows(self, environment: str) -> list[dict[str, Any]]:
        """The shipped example rows of an environment, parsed (blank lines skipped)."""
        path = self.example_paths.get(environment)
        if path is None:
            raise ConfigError(f"{environment!r} is not an environment of this stack")
        rows = []
        for line in path.read_text().splitlines():
            if line.strip():
                rows.append(json.loads(line))
        return rows

    def _head_url(self) -> str:
        return f"http://{self.config.head_host}:{self.config.head_port}"

    def _server_instances(self) -> list[dict[str, Any]]:
        """One ``ServerInstanceDisplayConfig`` per server, as ``gym env start`` lists them."""
        now = time.time()
        by_name = {p.name: p for p in self._processes}
        return [
            encode_server_instance(
                ServerInstance(
                    name=spec.instance,
                    server_type=spec.server_type,
                    implementation=spec.impl,
                    host=spec.host,
                    port=spec.port,
                ),
                url=spec.url,
                dir_path=str(self._dirs[f"{spec.server_type}/{spec.impl}"]),
                entrypoint=spec.entrypoint,
                pid=by_name[spec.instance].pid,
                started=now,
            )
            for spec in self.config.servers
        ]

    def _server_dirs(self) -> dict[str, Path]:
        """``server_type/impl`` -> the directory each server runs in (overlay, venv or SDK)."""
        files = {key: dict(extra) for key, extra in self._server_files.items()}
        for environment in self._environments:
            directory, _ = split_environment_name(environment)
            key = f"resources_servers/{directory}"
            given = files.setdefault(key, {})
            stand_ins = {
                path: text
                for path, text in missing_data_files(self._venv, directory).items()
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
                del files[key]
        dirs: dict[str, Path] = {}
        for spec in self.config.servers:
            key = f"{spec.server_type}/{spec.impl}"
            if key in dirs:
                continue
            if spec.server_type == RESOURCES:
                original = locate_environment(self._venv, spec.impl).directory
            else:
                original = self._venv.server_dir(spec.server_type, spec.impl)
            if key in files:
                dirs[key] = make_overlay(original, self.workdir / "servers" / key, files.pop(key))
            else:
                dirs[key] = original
        if files:
            raise ConfigError(f"server_files for servers the stack does not run: {sorted(files)}")
        self._dirs = dirs
        return dirs

    def _prepare_server_envs(self, base_env: Mapping[str, str]) -> dict[str, ServerEnvironment]:
        """Each server's interpreter, its requirements installed first when enabled."""
        envs: dict[str, ServerEnvironment] = {}
        for spec in self.config.servers:
            key = f"{spec.server_type}/{spec.impl}"
            if key in envs:
                continue
            if not self._install_requirements:
                envs[key] = ServerEnvironment(
                    server=key, python=self._venv.python, root=None, reused=True
                )
                continue
            envs[key] = prepare_server_environment(
                self._venv,
                spec.server_type,
                spec.impl,
                server_dir=self._dirs[key],
                cache_root=self._requirements_cache,
                env=base_env,
            )
        self._server_envs = envs
        return envs

    def _child_env(self, config_text: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in _SCRUBBED_ENV}
        env = {k: v for k, v in env.items() if not k.startswith("NEMO_GYM_")}
        bin_dirs = [str(self._venv.python.parent), *_uv_dir()]
        env["PATH"] = os.pathsep.join([*bin_dirs, env.get("PATH", "")])
        env["VIRTUAL_ENV"] = str(self._venv.root)
        env["PYTHONUNBUFFERED"] = "1"
        # Never write __pycache__ into the venv or the SDK's package (envs/<name>/rules.py).
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        no_proxy = ",".join(filter(None, [env.get("NO_PROXY", ""), "127.0.0.1,localhost"]))
        env["NO_PROXY"] = env["no_proxy"] = no_proxy
        env.update(self._extra_env)
        env["NEMO_GYM_CONFIG_DICT"] = config_text
        return env

    # ------------------------------------------------------- one deployment model

    def directory(self) -> ServerDirectory:
        """The running stack as a :class:`~nemogym_sdk.ServerDirectory`, the object
        ``ServerDirectory.from_head`` returns for a remote deployment.

        Built from the stack's own instances (no HTTP), in manual and head-server mode
        alike: agents, resources servers and model servers by instance name, each with
        its implementation and config block; ``head_url`` and the global config are set
        as discovery would set them.
        """
        if not self._running:
            raise RuntimeError("the stack is not running: start it first")
        config = self.config.global_config
        servers = []
        for spec in self.config.servers:
            block = config.get(spec.instance, {}).get(spec.server_type, {}).get(spec.impl, {})
            servers.append(
                ServerInfo(
                    name=spec.instance,
                    server_type=spec.server_type,
                    url=spec.url,
                    implementation=spec.impl,
                    config=block,
                )
            )
        return ServerDirectory(servers, head_url=self.head_url, config=config)

    def task_rows(self, environment: str) -> list[TaskRow]:
        """The shipped example rows of an environment as ``TaskRow``s, read by
        ``nemogym_sdk.data``: their ids (``<path>:<line>``) equal those ``load_rows``
        gives for :attr:`example_paths` ``[environment]``."""
        path = self.example_paths.get(environment)
        if path is None:
            raise ConfigError(f"{environment!r} is not an environment of this stack")
        return read_rows(path)


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
    """``VIRTUAL_ENV`` and ``PATH`` of a server running in its own venv (none: no change)."""
    if venv_root is None:
        return {}
    path = base_env.get("PATH", "")
    return {
        "VIRTUAL_ENV": str(venv_root),
        "PATH": os.pathsep.join([str(venv_root / "bin"), path]),
    }


def _file_safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
