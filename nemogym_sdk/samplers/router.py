"""vLLM's router in front of sampler replicas: ``start_router`` runs ``vllm-router`` on loopback.

Several samplers serve one policy behind `vllm-router <https://pypi.org/project/vllm-router/>`_
(a Rust binary on PyPI, in a venv of its own: ``.venv-router``, made by ``make router-venv``).
The SDK never replaces it; it starts it, waits until it routes, and stops it::

    from nemogym_sdk.samplers import start_router

    with start_router([w1.url, w2.url]) as router:
        router.base_url            # "http://127.0.0.1:<port>/v1": what a proxy generates through
        router.workers()           # [{"url": ..., "is_healthy": True, ...}, ...]

It runs ``--policy sticky_least_loaded``: the first request of a key (the header
``x-session-id``, ``nemogym_sdk.wire.ROUTER_SESSION_HEADER``) goes to the least loaded healthy
worker and every later one to the same worker; ``nemogym_sdk.serve`` in front of the router
sends a group's key, so a group's rollouts share one replica's prefix cache and the groups
spread evenly. (``consistent_hash`` also keeps a key on one worker, but hashes keys onto
workers unevenly: with a few dozen groups in flight, 0.79 of linear scaling at eight replicas
against 1.00, ``benchmarks/bench_router_scaling.py``.) A worker that dies is
dropped by the router's circuit breaker and health checks (every ``health_interval``
seconds), and its keys move to the others; a request already sent to it is retried there.

What the router does not do, and the SDK therefore does itself: it forwards
``POST /v1/load_lora_adapter`` to one worker only and answers ``/v1/models`` from one, so
adapters are published to every replica directly (``nemogym_sdk.serve --replica``); and it
drops unknown fields of chat messages (NeMo Gym's token ids among them), so the token-exact
splice happens in front of it, never behind.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import attrs
import requests

from nemogym_sdk.errors import ConfigError
from nemogym_sdk.hosts import server_root
from nemogym_sdk.processes import (
    LOOPBACK,
    ServerProcess,
    StopOnExit,
    default_log_path,
    free_loopback_ports,
    start_server,
    stop_all,
)
from nemogym_sdk.wire import ROUTER_FINISH_SESSION, SESSION_ID

__all__ = [
    "ROUTER_ENV_VAR",
    "RouterNotFoundError",
    "RouterProcess",
    "find_router",
    "finish_sessions",
    "start_router",
]

ROUTER_ENV_VAR = "NEMOGYM_ROUTER"
"""Environment variable naming the ``vllm-router`` executable (or the venv holding it)."""

_REPO_ROOT = Path(__file__).resolve().parents[2]


class RouterNotFoundError(ConfigError):
    """No ``vllm-router`` executable was found."""


def find_router(path: str | os.PathLike[str] | None = None) -> Path:
    """The ``vllm-router`` executable: ``path`` (the binary or a venv), else
    ``$NEMOGYM_ROUTER``, else ``<repo>/.venv-router``, else the one on ``PATH``."""
    hint = (
        "Install it with `make router-venv` (vllm-router==0.1.17 in .venv-router), or point "
        f"${ROUTER_ENV_VAR} at the executable or the venv holding it."
    )
    given = path if path is not None else os.environ.get(ROUTER_ENV_VAR)
    candidates: list[Path] = []
    if given:
        root = Path(given).expanduser()
        candidates = [root / "bin" / "vllm-router"] if root.is_dir() else [root]
    else:
        candidates = [_REPO_ROOT / ".venv-router" / "bin" / "vllm-router"]
        on_path = shutil.which("vllm-router")
        if on_path:
            candidates.append(Path(on_path))
    for candidate in candidates:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    raise RouterNotFoundError(
        f"vllm-router not found (looked at {', '.join(map(str, candidates))}). {hint}"
    )


@attrs.define(kw_only=True, eq=False)
class RouterProcess(StopOnExit):
    """A running ``vllm-router``; a context manager that stops it on exit."""

    process: ServerProcess
    """The router process (leader of its own process group)."""
    url: str
    """``http://127.0.0.1:<port>``."""
    worker_urls: tuple[str, ...]
    """The workers it was started with (server roots)."""

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:<port>/v1``: where OpenAI requests go."""
        return f"{self.url}/v1"

    @property
    def pid(self) -> int:
        """Process id (also its process-group id)."""
        return self.process.pid

    def workers(self, timeout: float = 5.0) -> list[dict[str, Any]]:
        """The router's view of its workers (``GET /workers``): url, health, load."""
        with requests.Session() as http:
            http.trust_env = False
            answer = http.get(f"{self.url}/workers", timeout=timeout)
            answer.raise_for_status()
            data = answer.json()
        workers = data.get("workers", data) if isinstance(data, dict) else data
        return [w for w in workers if isinstance(w, dict)] if isinstance(workers, list) else []

    def healthy(self, timeout: float = 5.0) -> list[str]:
        """The workers the router routes to now (server roots)."""
        return [
            server_root(str(w.get("url")))
            for w in self.workers(timeout)
            if w.get("is_healthy", True)
        ]

    def stop(self, grace: float = 5.0) -> None:
        """SIGTERM the process group, SIGKILL after ``grace`` seconds (idempotent)."""
        stop_all([self.process], grace)


def start_router(
    worker_urls: Sequence[str],
    *,
    policy: str = "sticky_least_loaded",
    health_interval: float = 1.0,
    request_timeout: float = 1800.0,
    executable: str | os.PathLike[str] | None = None,
    extra_args: Sequence[str] = (),
    log_path: str | os.PathLike[str] | None = None,
    ready_timeout: float = 60.0,
) -> RouterProcess:
    """Start ``vllm-router`` on a free loopback port in front of ``worker_urls``.

    Args:
        worker_urls: the replicas (``http://host:port`` or ``.../v1``), already answering.
        policy: the router's ``--policy`` (``sticky_least_loaded`` keeps a group's key on
            one worker and gives new keys to the least loaded one).
        health_interval: seconds between its health checks of the workers; a worker failing
            two in a row is dropped until it answers again.
        request_timeout: seconds one attempt at a worker may take (a whole generation).
        executable: the ``vllm-router`` binary or its venv (default: `find_router`).
        extra_args: more flags for the router.
        log_path: its log file; default a file in the temporary directory.
        ready_timeout: seconds to wait for ``GET /readiness``.

    Raises ``RouterNotFoundError`` without the binary, ``ServerStartError`` (the log's tail
    included) if it exits, ``ServerNotReadyError`` if it does not get ready in time.
    """
    if not worker_urls:
        raise ConfigError("start_router needs at least one worker URL")
    binary = find_router(executable)
    workers = tuple(server_root(url) for url in worker_urls)
    port, metrics_port = free_loopback_ports(2)
    interval = str(max(1, round(health_interval)))
    argv = [str(binary), "--host", LOOPBACK, "--port", str(port)]
    argv += ["--policy", policy, "--worker-urls", *workers]
    argv += ["--prometheus-host", LOOPBACK, "--prometheus-port", str(metrics_port)]
    argv += ["--health-check-interval-secs", interval, "--health-failure-threshold", "2"]
    argv += ["--health-check-timeout-secs", "2", "--worker-startup-check-interval", "1"]
    argv += ["--request-timeout-secs", str(int(request_timeout)), "--log-level", "warning"]
    argv += list(extra_args)
    process = start_server(
        "vllm-router",
        argv,
        log_path=Path(log_path) if log_path is not None else default_log_path("router", port),
        health_url=f"http://{LOOPBACK}:{port}/readiness",
        ready_timeout=ready_timeout,
    )
    return RouterProcess(process=process, url=f"http://{LOOPBACK}:{port}", worker_urls=workers)


def finish_sessions(url: str, keys: Iterable[str], *, timeout: float = 5.0) -> list[str]:
    """Tell the router at ``url`` (or a ``nemogym_sdk.serve`` in front of one; a server or
    its ``/v1`` URL) that the groups ``keys`` are done (``POST /finish_session``), so its
    table holds the groups in flight only and a replica's count of active sessions means
    what it says. Best effort: the refusals, as sentences (empty when every key was
    forgotten); never raises for the network.
    """
    root = server_root(url)
    refused = []
    with requests.Session() as session:
        session.trust_env = False  # loopback and cluster URLs: never through a proxy
        for key in dict.fromkeys(keys):  # a row trained twice in a step is one key
            try:
                answer = session.post(
                    f"{root}{ROUTER_FINISH_SESSION}", params={SESSION_ID: key}, timeout=timeout
                )
            except requests.RequestException as error:
                refused.append(f"{key}: {type(error).__name__}")
                continue
            if not answer.ok:
                refused.append(f"{key}: HTTP {answer.status_code} {answer.text[:200]}")
    return refused
