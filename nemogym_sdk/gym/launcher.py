"""``GymLauncher``: the environments of a ``GymStack``, started by NeMo Gym's own launcher.

``GymStack`` starts each server itself (fast, no Ray). A NeMo Gym user deploys with NeMo Gym's
launcher instead, ``gym env start``: Ray, the head server, every server process, its own
readiness checks. ``GymLauncher`` runs exactly that, for the same environments and the same
resolved config, so a deployment the SDK attaches to through its head server can be the real
thing::

    with GymLauncher(["target_chars"], PolicyModel(base_url=..., model="policy")) as gym:
        gym.directory          # ServerDirectory.from_head(gym.head_url)
        gym.head_url           # "http://127.0.0.1:<port>"

What the SDK prepares, so that the launcher builds nothing: each server's interpreter (the
NeMo Gym venv, or the per-server venv ``GymStack`` builds with uv) is linked where the
launcher looks for it (``uv_venv_dir/<type>/<name>/.venv``, with ``skip_venv_if_present``),
and each server's directory (NeMo Gym's, the SDK's own ``target_chars``, a user's from
``env_path``, or an overlay with extra data files) where it searches first
(``NEMO_GYM_EXTRA_ROOTS``). The launcher runs in a process group of its own, in ``workdir``
(its ``env.yaml``, logs and Ray files); stopping sends it SIGINT (it stops its servers and
its Ray cluster), then ends whatever is left of its group.
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import yaml

from nemogym_sdk.directory import ServerDirectory
from nemogym_sdk.errors import ConfigError, UsageError
from nemogym_sdk.gym.builder import StackBuilder
from nemogym_sdk.gym.locate import GymVenv, environment_path, find_gym_venv
from nemogym_sdk.gym.specs import ENVIRONMENT_SERVERS, PolicyModel, StackConfig
from nemogym_sdk.processes import ServerProcess, spawn, stop_all, stopping_on_error, wait_ready
from nemogym_sdk.processes.watchdog import watch

__all__ = ["GymLauncher"]

logger = logging.getLogger(__name__)

LEGACY_RELAY = "legacy_agent"
"""NeMo Gym's environment server that relays ``/run`` to an agent."""


class GymLauncher:
    """Environments started by ``gym env start`` (NeMo Gym's launcher, with Ray).

    Args:
        environments: as for ``GymStack``.
        model: the policy's OpenAI-compatible backend (``policy_model``).
        judge: as for ``GymStack``.
        venv: the NeMo Gym venv (its ``gym`` command runs the launcher).
        env_path: as for ``GymStack``: directories holding environments of your own, searched
            first (default ``$NEMOGYM_ENV_PATH``); the launcher finds each through
            ``NEMO_GYM_EXTRA_ROOTS``, like the SDK's.
        workdir: where the launcher runs (``env.yaml``, ``logs/gym.log``); default a fresh
            temporary directory.
        ready_timeout: seconds until the head server's ``/readyz`` must answer 200 (Ray's
            start included).
        stop_grace: seconds the launcher gets to stop its servers and Ray after SIGINT.
        overrides: deep-merged into the global config last.
        extra_env: extra environment variables for the launcher and its servers.
        install_requirements: as for ``GymStack``.
    """

    def __init__(
        self,
        environments: Sequence[str],
        model: PolicyModel,
        *,
        judge: PolicyModel | None = None,
        venv: GymVenv | str | os.PathLike[str] | None = None,
        env_path: Sequence[str | os.PathLike[str]] | None = None,
        workdir: str | os.PathLike[str] | None = None,
        ready_timeout: float = 180.0,
        stop_grace: float = 30.0,
        overrides: Mapping[str, Any] | None = None,
        extra_env: Mapping[str, str] | None = None,
        install_requirements: bool = True,
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
            overrides=dict(overrides or {}),
            install_requirements=install_requirements,
            extra_env=dict(extra_env or {}),
            env_path=environment_path(env_path),
        )
        self._workdir_arg = Path(workdir) if workdir is not None else None
        self._ready_timeout = ready_timeout
        self._stop_grace = stop_grace
        self._process: ServerProcess | None = None
        self._config: StackConfig | None = None
        self._directory: ServerDirectory | None = None
        self.workdir: Path | None = None
        """Where the launcher runs, once started."""

    def start(self) -> GymLauncher:
        """Run ``gym env start`` and wait until its head server reports every server ready."""
        if self._process is not None:
            raise UsageError("GymLauncher.start() was already called; create a new one")
        began = time.monotonic()
        workdir = self._workdir_arg.resolve() if self._workdir_arg else None
        if workdir is None:
            workdir = Path(tempfile.mkdtemp(prefix="nemogym-launcher-"))
        workdir.mkdir(parents=True, exist_ok=True)
        self.workdir = workdir
        config = self._config = self.builder.build(workdir)
        launch = self.builder.launch(config, workdir)  # per-server venvs and directories
        roots, venvs = workdir / "roots", workdir / "venvs"
        for key, directory in launch.server_dirs.items():
            _link(roots / key, directory)
            interpreter = launch.server_envs[key].root or self.builder.venv.root
            _link(venvs / key / ".venv", interpreter)
        # the launcher's parser puts a relay in front of every agent (``gym eval run`` posts
        # there); it runs in the NeMo Gym venv
        _link(venvs / ENVIRONMENT_SERVERS / LEGACY_RELAY / ".venv", self.builder.venv.root)
        settings = {"uv_venv_dir": str(venvs), "skip_venv_if_present": True}
        text = yaml.safe_dump({**yaml.safe_load(config.to_yaml()), **settings}, sort_keys=False)
        (workdir / "env.yaml").write_text(text)
        env = dict(launch.base_env)
        env.pop("NEMO_GYM_CONFIG_DICT", None)  # the launcher resolves env.yaml itself
        env["NEMO_GYM_EXTRA_ROOTS"] = str(roots)
        gym = self.builder.venv.python.parent / "gym"
        atexit.register(self.stop)
        self._process = spawn(
            "gym env start",
            [str(gym), "env", "start", "--config", str(workdir / "env.yaml")],
            cwd=workdir,
            env=env,
            log_path=workdir / "logs" / "gym.log",
            health_url=f"{self.head_url}/readyz",
        )
        # should this process die unstopped, its watchdog stops the launcher as stop() does
        watch(self._process.pid, first_signal=signal.SIGINT, leader_only=True, grace=10.0)
        with stopping_on_error(self._process, stop=self.stop):  # SIGINT first: Ray's way
            wait_ready([self._process], self._ready_timeout)
            self._directory = ServerDirectory.from_head(self.head_url, wait=10)
        logger.info(
            "NeMo Gym launcher ready in %.1f s: head %s, %d servers",
            time.monotonic() - began,
            self.head_url,
            len(config.servers),
        )
        return self

    @property
    def head_url(self) -> str:
        """``http://<host>:<port>`` of the launcher's head server."""
        if self._config is None:
            raise UsageError("the launcher has not been started")
        return f"http://{self._config.head_host}:{self._config.head_port}"

    @property
    def directory(self) -> ServerDirectory:
        """The deployment, as its head server describes it (``ServerDirectory.from_head``)."""
        if self._directory is None:
            raise UsageError("the launcher is not running: start it first")
        return self._directory

    @property
    def config(self) -> StackConfig:
        """The resolved config the launcher was given."""
        if self._config is None:
            raise UsageError("the launcher has not been started")
        return self._config

    @property
    def pid(self) -> int:
        """The launcher's pid (also its process-group id)."""
        if self._process is None:
            raise UsageError("the launcher has not been started")
        return self._process.pid

    @property
    def log_path(self) -> Path:
        """The launcher's log (its servers' output included)."""
        if self._process is None:
            raise UsageError("the launcher has not been started")
        return self._process.log_path

    def stop(self) -> None:
        """SIGINT the launcher (it stops its servers and Ray), wait up to ``stop_grace``, then
        end whatever is left of its process group. Idempotent."""
        process = self._process
        if process is None or process.stopped:
            return
        atexit.unregister(self.stop)
        if process.popen.poll() is None:
            os.kill(process.pid, signal.SIGINT)
            try:
                process.popen.wait(timeout=self._stop_grace)
            except subprocess.TimeoutExpired:
                logger.warning("gym env start ignored SIGINT for %.0f s", self._stop_grace)
        stop_all([process], grace=5.0)

    def __enter__(self) -> GymLauncher:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()


def _link(link: Path, target: Path) -> None:
    link.parent.mkdir(parents=True, exist_ok=True)
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(target, target_is_directory=True)
