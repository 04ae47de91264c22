"""``GymStack``: real NeMo Gym servers for shipped environments, started and stopped locally.

A stack is a config builder (:class:`~nemogym_sdk.gym.builder.StackBuilder`: what to
start and how each server runs) and a process group
(:class:`~nemogym_sdk.processes.ProcessGroup`: the running servers). Where the servers
listen is :attr:`GymStack.directory`, the :class:`~nemogym_sdk.ServerDirectory` a remote
deployment's head server gives.

Manual mode (default) starts each server the way ``gym env start`` would, minus Ray
and the head server: ``<gym venv>/bin/python app.py`` in the server's directory, with
the whole resolved config in ``NEMO_GYM_CONFIG_DICT`` and the server's instance name in
``NEMO_GYM_CONFIG_PATH``. Environments shipped with the SDK (``nemogym_sdk/gym/envs``,
e.g. ``target_chars``) run the same way from their directory in the SDK, with the venv's
interpreter. Servers run with ``PYTHONDONTWRITEBYTECODE=1``, so neither the venv nor the
SDK's package directory is ever written to. A server whose directory lists requirements
beyond nemo-gym (``requirements.txt``, e.g. ``math-verify`` for ``math_with_judge``) runs
with the interpreter of a venv of its own, built with uv on first use and cached (see
:mod:`nemogym_sdk.gym.server_envs`), and keeps its compiled bytecode inside that venv.
Head-server mode adds NeMo Gym's own ``HeadServer`` in a small process of its own (see
:mod:`nemogym_sdk.gym.head_main`), so clients can discover the servers through
``GET /server_instances`` and ``GET /global_config_dict_yaml``.

Example::

    model = PolicyModel(base_url="http://127.0.0.1:8000/v1", model="tiny")
    with GymStack(["example_single_tool_call"], model) as stack:
        agent = stack.environment("example_single_tool_call").agent
        url = stack.directory.agent_url(agent)   # POST {url}/run
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
from nemogym_sdk.directory import ServerDirectory, ServerInfo, resolve_interpolations
from nemogym_sdk.errors import ConfigError, UsageError
from nemogym_sdk.gym.builder import HEAD_SERVER_NAME, Launch, StackBuilder
from nemogym_sdk.gym.locate import GymVenv, environment_path, find_gym_venv
from nemogym_sdk.gym.overlay import FileSource
from nemogym_sdk.gym.server_envs import ServerEnvironment
from nemogym_sdk.gym.specs import EnvironmentSetup, PolicyModel, StackConfig
from nemogym_sdk.processes import ProcessGroup, wait_answering
from nemogym_sdk.records import TaskRow

__all__ = ["HEAD_SERVER_NAME", "GymStack"]

logger = logging.getLogger(__name__)


class GymStack:
    """A set of real NeMo Gym servers for some shipped environments, on loopback ports.

    Nothing starts until :meth:`start` (or ``with``). All servers bind 127.0.0.1 on
    free ports picked at start. Logs go to ``<workdir>/logs/<instance>.log`` and stay
    there after :meth:`stop`; the resolved config is written to
    ``<workdir>/config.yaml``.

    Args:
        environments: environment names, e.g. ``["example_single_tool_call"]``: NeMo Gym's
            (``resources_servers/<name>`` in the venv), the SDK's own
            (:data:`~nemogym_sdk.gym.SDK_ENVIRONMENTS`, e.g. ``"target_chars"``) or a
            user's (on ``env_path``), or ``"<directory>:<config>"`` for another of its
            configs. One whose config starts no agent runs with the agent its
            ``allowed_agents`` names (``gdpval``: see :mod:`~nemogym_sdk.gym.loading`).
        model: the OpenAI-compatible backend, served to the agents as ``policy_model``.
        head_server: also run NeMo Gym's head server (discovery endpoints).
        judge: the OpenAI-compatible endpoint (``base_url``, ``model``: the served model
            name, ``api_key``) that every other model server the environments call is
            pointed at: judges, user simulators, reward models (see "Judges and other model
            servers" in ``docs/gym-environments.md``). Default: ``model``'s backend; then
            environments whose judge is ``policy_model`` keep judging on the policy's server.
        venv: the NeMo Gym venv (a :class:`GymVenv` or a path); default
            ``$NEMOGYM_GYM_VENV`` or ``<repo>/.venv-gym``.
        env_path: directories holding environments of your own (``<dir>/<name>/configs/
            <name>.yaml``, ``app.py``, ``data/``), searched in order before the SDK's and
            NeMo Gym's (the first directory holding a name wins, shadowing a shipped
            environment of that name); default ``$NEMOGYM_ENV_PATH`` (``os.pathsep``-
            separated). A directory that does not exist is a ``ConfigError``.
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
            uv and cached (:mod:`~nemogym_sdk.gym.server_envs`); ``False`` runs every
            server in ``venv`` as it is (for users who manage that venv themselves).
        requirements_cache: where those venvs are cached; default ``$NEMOGYM_SERVER_ENVS``,
            else ``$XDG_CACHE_HOME/nemogym_sdk/server-envs``.
        environment_servers: also start each environment's environment server (NeMo Gym's
            ``legacy_agent`` relay, without the Ray cluster it would start), which NeMo
            Gym's own rollout collection (``ng_collect_rollouts``, ``RolloutCollectionHelper``)
            and ``gym eval run`` post ``/run`` to; with ``head_server``, they find it there.
    """

    def __init__(
        self,
        environments: Sequence[str],
        model: PolicyModel,
        *,
        head_server: bool = False,
        judge: PolicyModel | None = None,
        venv: GymVenv | str | os.PathLike[str] | None = None,
        env_path: Sequence[str | os.PathLike[str]] | None = None,
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
        environment_servers: bool = False,
    ) -> None:
        if isinstance(environments, str):
            raise ConfigError(
                f"environments must be a sequence of names, not a string: got {environments!r} "
                f"(write [{environments!r}])"
            )
        self.builder = StackBuilder(
            venv=venv if isinstance(venv, GymVenv) else find_gym_venv(venv),
            environments=tuple(environments),
            model=model,
            judge=judge,
            default_max_steps=default_max_steps,
            overrides=dict(overrides or {}),
            server_files={key: dict(files) for key, files in (server_files or {}).items()},
            install_requirements=install_requirements,
            requirements_cache=Path(requirements_cache) if requirements_cache else None,
            extra_env=dict(extra_env or {}),
            environment_servers=environment_servers,
            env_path=environment_path(env_path),
        )
        """What the stack is made of (the config builder)."""
        self._head_server = head_server
        self._workdir_arg = Path(workdir) if workdir is not None else None
        self._ready_timeout = ready_timeout
        self._backend_timeout = backend_timeout
        self._stop_grace = stop_grace
        self._group = ProcessGroup()
        self._workdir: Path | None = None
        self._config: StackConfig | None = None
        self._launch: Launch | None = None
        self._directory: ServerDirectory | None = None
        self._started = False
        self._running = False

    # ----------------------------------------------------------------- lifecycle

    def start(self) -> GymStack:
        """Start every server and wait until all are ready; returns ``self``.

        On any failure (bad config, missing example rows, a server exiting, the deadline)
        everything started so far is stopped before the error propagates. A stack starts
        once.
        """
        if self._started:
            raise UsageError("GymStack.start() was already called; create a new GymStack")
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
            len(self._group),
            self._workdir,
        )
        return self

    def _start(self) -> None:
        if self._workdir_arg is not None:
            workdir = self._workdir_arg.resolve()
            workdir.mkdir(parents=True, exist_ok=True)
        else:
            workdir = Path(tempfile.mkdtemp(prefix="nemogym-gym-"))
        self._workdir = workdir
        config = self._config = self.builder.build(workdir)
        if self._backend_timeout is not None:
            self._wait_for_backends(self._backend_timeout)
        (workdir / "config.yaml").write_text(config.to_yaml())
        atexit.register(self.stop)
        self._running = True
        launch = self._launch = self.builder.launch(config, workdir)
        for process in launch.processes:
            self._group.spawn(process)
        if self._head_server:
            head = self.builder.head_process(config, workdir, launch, self._group.pids)
            self._group.spawn(head)
        self._group.wait_ready(self._ready_timeout)
        self._directory = _directory(config, self._head_url(config))

    def _wait_for_backends(self, timeout: float) -> None:
        model, judge = self.builder.model, self.builder.judge
        wait_answering(
            f"backend of {model.instance_name}", f"{model.base_url.rstrip('/')}/models", timeout
        )
        if judge is not None and judge.base_url != model.base_url:
            wait_answering("judge endpoint", f"{judge.base_url.rstrip('/')}/models", timeout)

    def _head_url(self, config: StackConfig) -> str | None:
        """``http://<host>:<port>`` of the head server of ``config`` in head-server mode."""
        return f"http://{config.head_host}:{config.head_port}" if self._head_server else None

    def stop(self) -> None:
        """Stop every process group (SIGTERM, then SIGKILL after the grace period).

        Idempotent; also runs at interpreter exit if the stack is still running.
        Logs and the config stay in :attr:`workdir`.
        """
        if not self._running:
            return
        self._running = False
        atexit.unregister(self.stop)
        # Agents first (they call the others), the head server last: last started first.
        self._group.stop(self._stop_grace)
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
        return f"GymStack({list(self.builder.environments)!r}, {mode} mode, {state})"

    # ---------------------------------------------------------------- properties

    @property
    def is_running(self) -> bool:
        """Whether the stack has been started and not stopped."""
        return self._running

    @property
    def venv(self) -> GymVenv:
        """The NeMo Gym venv the servers run in."""
        return self.builder.venv

    @property
    def directory(self) -> ServerDirectory:
        """Where the running stack's servers listen: the
        :class:`~nemogym_sdk.ServerDirectory` that ``ServerDirectory.from_head`` returns for
        a remote deployment, built from the stack's own instances (no HTTP), in manual and
        head-server mode alike: agents, resources servers and model servers by instance
        name, each with its implementation and config block; ``head_url`` (None in manual
        mode) and the global config (``${...}`` resolved) as discovery sets them."""
        if not self._running or self._directory is None:
            raise UsageError("the stack is not running: start it first")
        return self._directory

    @property
    def server_environments(self) -> dict[str, ServerEnvironment]:
        """``server_type/impl`` -> the interpreter it runs with (its own venv or ``venv``'s).

        Filled by :meth:`start`; ``reused`` tells whether a cached venv was used.
        """
        return dict(self._launch.server_envs) if self._launch is not None else {}

    @property
    def workdir(self) -> Path:
        """Directory holding ``config.yaml`` and ``logs/`` (exists once started)."""
        if self._workdir is None:
            raise UsageError("the stack has not been started")
        return self._workdir

    @property
    def config(self) -> StackConfig:
        """The resolved config the servers were started with."""
        if self._config is None:
            raise UsageError("the stack has not been started")
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
    def log_paths(self) -> dict[str, Path]:
        """Instance name (and ``head_server``) -> log file."""
        return self._group.log_paths

    @property
    def pids(self) -> dict[str, int]:
        """Instance name (and ``head_server``) -> pid, which is also its process-group id."""
        return self._group.pids

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

    # ------------------------------------------------------------------- helpers

    def environment(self, name: str) -> EnvironmentSetup:
        """What environment ``name`` contributed: its agents (``.agent``: the one its rows
        go to), resources servers, data; ``ConfigError`` if it is not in the stack."""
        return self.config.environment(name)

    def example_rows(self, environment: str) -> list[dict[str, Any]]:
        """The shipped example rows of an environment, parsed (blank lines skipped)."""
        path = self.environment(environment).example_path
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def task_rows(self, environment: str) -> list[TaskRow]:
        """The shipped example rows of an environment as ``TaskRow``s, read by
        ``nemogym_sdk.data``: their ids (``<path>:<line>``) equal those ``load_rows``
        gives for :attr:`example_paths` ``[environment]``."""
        return read_rows(self.environment(environment).example_path)


def _directory(config: StackConfig, head_url: str | None) -> ServerDirectory:
    """The stack's servers as a ``ServerDirectory``, as discovery would describe them."""
    resolved = resolve_interpolations(dict(config.global_config))
    servers = [
        ServerInfo(
            name=spec.instance,
            server_type=spec.server_type,
            url=spec.url,
            implementation=spec.impl,
            config=resolved.get(spec.instance, {}).get(spec.server_type, {}).get(spec.impl, {}),
        )
        for spec in config.servers
    ]
    return ServerDirectory(servers, head_url=head_url, config=resolved)
