"""Process supervision for the servers the SDK starts on this machine.

Every server (NeMo Gym's, ``nemogym_sdk.serve``, vLLM, ``vllm-router``) is spawned the same
way: a process group of its own, its output in a log file, polled until its health route
answers, stopped by its group (SIGTERM, then SIGKILL after a grace period), never by name;
a failed start names the server and quotes its log's tail.

- ``start_server``: the one start recipe (spawn, wait until ready, stop on any failure and
  re-raise); ``stopping_on_error`` extends that guarantee to work after the start;
- ``spawn``, ``wait_ready``, ``wait_answering``, ``stop_all``, ``tail``, ``group_alive``:
  its steps; ``ServerProcess`` a started process; ``ProcessSpec`` and ``ProcessGroup`` the
  servers of one stack; ``StopOnExit`` the ``with`` support of started servers;
- ``LOOPBACK``, ``PORT_RANGE`` and ``free_loopback_ports``: where they listen;
- ``ServerStartError`` and ``ServerNotReadyError``: how a start fails;
- ``forkserver``: a server whose start names modules to preload (NeMo Gym's servers,
  ``nemogym_sdk.serve`` samplers) is forked from an interpreter that imported them once
  (``NEMOGYM_FORK_SERVERS=0``: a new interpreter each).

``nemogym_sdk.gym`` (NeMo Gym's servers) and ``nemogym_sdk.samplers`` (model servers) both
start through this room; it imports neither.
"""

from __future__ import annotations

from nemogym_sdk.processes.errors import ServerNotReadyError, ServerStartError
from nemogym_sdk.processes.ports import LOOPBACK, PORT_RANGE, free_loopback_ports
from nemogym_sdk.processes.process import (
    ProcessGroup,
    ProcessSpec,
    ServerProcess,
    StopOnExit,
    group_alive,
    spawn,
    stop_all,
    tail,
    wait_answering,
    wait_ready,
)
from nemogym_sdk.processes.start import default_log_path, start_server, stopping_on_error

__all__ = [
    "LOOPBACK",
    "PORT_RANGE",
    "ProcessGroup",
    "ProcessSpec",
    "ServerNotReadyError",
    "ServerProcess",
    "ServerStartError",
    "StopOnExit",
    "default_log_path",
    "free_loopback_ports",
    "group_alive",
    "spawn",
    "start_server",
    "stop_all",
    "stopping_on_error",
    "tail",
    "wait_answering",
    "wait_ready",
]
