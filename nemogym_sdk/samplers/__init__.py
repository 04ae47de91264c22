"""Model servers the agents sample from, started as processes on this machine.

- ``start_serve``: ``nemogym_sdk.serve``, the CPU model server (``BackendProcess``);
- ``start_vllm``: real vLLM from a venv of its own (``find_vllm_venv``, ``VllmVenv``);
- ``start_router``: ``vllm-router`` in front of several replicas (``find_router``,
  ``RouterProcess``);
- ``start_samplers``: replicas, the router and the SDK's proxy in front of them
  (``SamplerFleet``); ``start_proxy``: that proxy in front of one vLLM or a router.

Each starts through ``nemogym_sdk.processes`` (a process group of its own, a log file,
stopped by its group). ``BackendProcess.policy_model()`` gives the ``PolicyModel`` that
``nemogym_sdk.gym.GymStack`` takes; ``nemogym_sdk.gym`` re-exports every name here but
``start_proxy``, as before this package existed.
"""

from __future__ import annotations

from nemogym_sdk.samplers.backend import BackendProcess, start_serve
from nemogym_sdk.samplers.replicas import SamplerFleet, start_proxy, start_samplers
from nemogym_sdk.samplers.router import (
    ROUTER_ENV_VAR,
    RouterNotFoundError,
    RouterProcess,
    find_router,
    finish_sessions,
    start_router,
)
from nemogym_sdk.samplers.vllm import (
    VLLM_VENV_ENV_VAR,
    VllmVenv,
    VllmVenvNotFoundError,
    default_vllm_venv_path,
    find_vllm_venv,
    start_vllm,
)

__all__ = [
    "BackendProcess",
    "ROUTER_ENV_VAR",
    "RouterNotFoundError",
    "RouterProcess",
    "SamplerFleet",
    "VLLM_VENV_ENV_VAR",
    "VllmVenv",
    "VllmVenvNotFoundError",
    "default_vllm_venv_path",
    "find_router",
    "find_vllm_venv",
    "finish_sessions",
    "start_proxy",
    "start_router",
    "start_samplers",
    "start_serve",
    "start_vllm",
]
