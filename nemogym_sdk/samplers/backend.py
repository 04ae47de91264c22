"""The CPU model server as a process: ``nemogym_sdk.serve`` on a loopback port.

NeMo Gym's ``vllm_model`` needs an OpenAI-compatible backend to sample from. `start_serve`
launches ``python -m nemogym_sdk.serve`` (the CPU model server) in a process group of its own,
waits until it answers, and returns a `BackendProcess` (what ``start_vllm`` returns too) whose
`policy_model` plugs into ``GymStack``::

    with start_serve(mode="sample", logprobs_mode="processed_logprobs") as backend:
        model = backend.policy_model("policy")          # the LoRA adapter's served name
        with GymStack(["target_chars"], model) as stack:
            ...

The process runs the SDK's own interpreter (torch and transformers live there), logs to a
file, and is stopped by its process group, never by name.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import attrs

from nemogym_sdk.processes import (
    LOOPBACK,
    ServerProcess,
    StopOnExit,
    default_log_path,
    free_loopback_ports,
    start_server,
    stop_all,
    stopping_on_error,
)

if TYPE_CHECKING:
    from nemogym_sdk.gym.specs import PolicyModel

__all__ = ["SERVE_PRELOAD", "BackendProcess", "serve_env", "start_serve"]

SERVE_PRELOAD = ("torch", "transformers", "peft", "nemogym_sdk.serve.app")
"""What a ``nemogym_sdk.serve`` sampler imports before it loads its model (~4 s of CPU):
imported once per fork server, when samplers are started with ``fork=True``."""


@attrs.define(kw_only=True, eq=False)
class BackendProcess(StopOnExit):
    """A running model backend; a context manager that stops it on exit."""

    process: ServerProcess
    """The server process (leader of its own process group)."""
    base_url: str
    """``http://127.0.0.1:<port>/v1``: what ``vllm_model`` and ``LoraSync`` take."""
    served_model_name: str
    """The base model's name on the server."""

    @property
    def pid(self) -> int:
        """Process id (also its process-group id)."""
        return self.process.pid

    @property
    def log_path(self) -> Path:
        """Where its stdout and stderr go."""
        return self.process.log_path

    def policy_model(self, model: str | None = None, **kwargs: object) -> PolicyModel:
        """A ``PolicyModel`` for ``GymStack`` that requests ``model`` (default: the base model).

        Pass the LoRA adapter's name when training one: NeMo Gym's model server requests that
        name, so every rollout samples the adapter (see ``docs/lora-sync.md``).
        """
        from nemogym_sdk.gym.specs import PolicyModel  # gym's record; gym imports samplers

        return PolicyModel(
            base_url=self.base_url,
            model=model or self.served_model_name,
            **kwargs,  # type: ignore[arg-type]
        )

    def stop(self, grace: float = 5.0) -> None:
        """SIGTERM the process group, SIGKILL after ``grace`` seconds (idempotent)."""
        stop_all([self.process], grace)


def start_serve(
    *,
    mode: str = "sample",
    logprobs_mode: str = "processed_logprobs",
    model: str | os.PathLike[str] | None = None,
    served_model_name: str | None = None,
    seed: int = 0,
    extra_args: Sequence[str] = (),
    log_path: str | os.PathLike[str] | None = None,
    ready_timeout: float = 120.0,
    port: int | None = None,
    fork: bool = False,
) -> BackendProcess:
    """Start ``python -m nemogym_sdk.serve`` on a free loopback port and wait until it answers.

    Args:
        mode: ``sample`` (real sampling) or ``scripted`` (see ``nemogym_sdk.serve``).
        logprobs_mode: ``processed_logprobs`` (what GRPO's ratio needs) or ``raw_logprobs``.
        model: a local model directory; None = the built-in tiny model (weights from ``seed``).
        served_model_name: the base model's name; default the one the server reports (the
            tiny model's name, or the path).
        seed: seed of the tiny model's weights and of sampling.
        extra_args: more command-line flags for the server.
        log_path: its log file; default a file in the temporary directory.
        ready_timeout: seconds to wait for ``/health``.
        port: the loopback port to serve on (one chosen beforehand, so that its URL can be
            handed out before it answers); default a free one.
        fork: fork it from this process's fork server for the interpreter, which imported
            torch, transformers and peft once (``SERVE_PRELOAD``, ~4 s of CPU a start
            otherwise): worth it where one process starts several samplers (replicas, a
            test session). ``--backend vllm`` (the proxy) needs only transformers of them
            (~2 s of its ~4 s start), so fork it where that fork server runs anyway;
            ``NEMOGYM_FORK_SERVERS=0`` overrides it (see `nemogym_sdk.processes.forkserver`).

    The server's torch threads wait passively (``OMP_WAIT_POLICY=PASSIVE`` unless this
    process's environment sets it): it shares the machine's cores with a learner, and threads
    that spin while they wait starve it (a GRPO loop beside one busy core ran 10x slower).

    Raises ``ServerStartError`` (the log's tail included) if it exits, ``ServerNotReadyError``
    if it does not answer in time; the process is stopped before either propagates.
    """
    if port is None:
        (port,) = free_loopback_ports(1)
    argv = [sys.executable, "-m", "nemogym_sdk.serve", "--host", LOOPBACK, "--port", str(port)]
    argv += ["--mode", mode, "--logprobs-mode", logprobs_mode, "--seed", str(seed)]
    if model is not None:
        argv += ["--model", str(model)]
    if served_model_name is not None:
        argv += ["--served-model-name", served_model_name]
    argv += list(extra_args)
    process = start_server(
        "nemogym_sdk.serve",
        argv,
        log_path=Path(log_path) if log_path is not None else default_log_path("serve", port),
        health_url=f"http://{LOOPBACK}:{port}/health",
        ready_timeout=ready_timeout,
        env=serve_env(),
        preload=SERVE_PRELOAD if fork else (),
    )
    base_url = f"http://{LOOPBACK}:{port}/v1"
    with stopping_on_error(process):
        served = served_model_name or _base_model_name(base_url)
    return BackendProcess(process=process, base_url=base_url, served_model_name=served)


def serve_env() -> dict[str, str]:
    """A sampler's environment: this process's, its torch threads waiting passively unless
    this process says otherwise (it shares the cores with a learner)."""
    return {"OMP_WAIT_POLICY": "PASSIVE", **os.environ}


def _base_model_name(base_url: str) -> str:
    """The name the server serves its base model under: the first card of ``/v1/models``."""
    import requests

    from nemogym_sdk._net.http import check, send

    with requests.Session() as http:
        url = f"{base_url}/models"
        answer = check(send(http, "GET", url, timeout=10.0), f"GET {url}")
    return str(answer.json()["data"][0]["id"])
