"""Start and stop real NeMo Gym servers locally (optional; not imported by ``nemogym_sdk``).

NeMo Gym runs in a Python 3.13 venv of its own; this package never imports it. It
builds the resolved NeMo Gym config for some shipped environments, launches each server
with that venv's interpreter (optionally with NeMo Gym's head server for discovery),
waits until they answer, and stops them by process group.

    from nemogym_sdk.gym import GymStack, PolicyModel

    model = PolicyModel(base_url="http://127.0.0.1:8000/v1", model="my-model")
    with GymStack(["example_single_tool_call", "wordle"], model, head_server=True) as stack:
        stack.directory.agents            # {"wordle_gymnasium_agent": "http://127.0.0.1:...", ...}
        stack.directory.head_url          # "http://127.0.0.1:..."
        stack.environment("wordle").agent # "wordle_gymnasium_agent": where its rows go
        stack.log_paths                   # instance -> log file

Configs are resolved by NeMo Gym's own parser, run in its venv
(:mod:`nemogym_sdk.gym.resolve`); the SDK adds the policy, judges, ports, per-server venvs
and the pairing of agent-less environments with an agent.

``GymLauncher`` starts the same environments with NeMo Gym's own launcher (``gym env
start``, Ray and the head server) instead.

This package is NeMo Gym only. The model servers the agents sample from live in
:mod:`nemogym_sdk.samplers` (``start_serve``, ``start_vllm``, ``start_router``,
``start_samplers`` ...) and process supervision in :mod:`nemogym_sdk.processes`
(``ProcessGroup``, ``ServerStartError`` ...); their names are re-exported here, as before
those packages existed.

See ``docs/gym-environments.md`` for what each shipped environment does, and
``docs/writing-an-environment.md`` for writing one (``SDK_ENVIRONMENTS``, e.g.
``target_chars``, ship with this package and start by name like NeMo Gym's own; your own
start by name from the directories on ``env_path`` or ``$NEMOGYM_ENV_PATH``).
"""

from __future__ import annotations

from nemogym_sdk.gym.builder import HEAD_SERVER_NAME, Launch, StackBuilder
from nemogym_sdk.gym.catalog import (
    CATALOGUE,
    SDK_ENVIRONMENTS,
    EnvironmentInfo,
    describe_environment,
)
from nemogym_sdk.gym.config import build_stack_config
from nemogym_sdk.gym.errors import (
    DatasetMissingError,
    GymVenvNotFoundError,
    RequirementsInstallError,
    ServerDirectoryMissingError,
    UvNotFoundError,
)
from nemogym_sdk.gym.launcher import GymLauncher
from nemogym_sdk.gym.locate import (
    ENV_PATH_ENV_VAR,
    GYM_VENV_ENV_VAR,
    SDK_ENVS_DIR,
    EnvironmentLocation,
    GymVenv,
    default_gym_venv_path,
    environment_path,
    find_gym_venv,
    locate_environment,
)
from nemogym_sdk.gym.requirements import ServerRequirements, read_server_requirements
from nemogym_sdk.gym.resolve import ResolvedEnvironment, resolve_environments
from nemogym_sdk.gym.server_envs import (
    REQUIREMENTS_CACHE_ENV_VAR,
    ServerEnvironment,
    default_requirements_cache,
    find_uv,
    prepare_server_environment,
)
from nemogym_sdk.gym.specs import EnvironmentSetup, PolicyModel, ServerSpec, StackConfig
from nemogym_sdk.gym.stack import GymStack
from nemogym_sdk.processes import (
    ProcessGroup,
    ProcessSpec,
    ServerNotReadyError,
    ServerStartError,
    free_loopback_ports,
)
from nemogym_sdk.samplers import (
    ROUTER_ENV_VAR,
    VLLM_VENV_ENV_VAR,
    BackendProcess,
    RouterNotFoundError,
    RouterProcess,
    SamplerFleet,
    VllmVenv,
    VllmVenvNotFoundError,
    default_vllm_venv_path,
    find_router,
    find_vllm_venv,
    start_router,
    start_samplers,
    start_serve,
    start_vllm,
)

__all__ = [
    "BackendProcess",
    "CATALOGUE",
    "DatasetMissingError",
    "ENV_PATH_ENV_VAR",
    "EnvironmentInfo",
    "EnvironmentLocation",
    "EnvironmentSetup",
    "GYM_VENV_ENV_VAR",
    "GymLauncher",
    "GymStack",
    "GymVenv",
    "GymVenvNotFoundError",
    "HEAD_SERVER_NAME",
    "Launch",
    "PolicyModel",
    "ProcessGroup",
    "ProcessSpec",
    "REQUIREMENTS_CACHE_ENV_VAR",
    "ROUTER_ENV_VAR",
    "RequirementsInstallError",
    "ResolvedEnvironment",
    "RouterNotFoundError",
    "RouterProcess",
    "SDK_ENVIRONMENTS",
    "SDK_ENVS_DIR",
    "SamplerFleet",
    "ServerDirectoryMissingError",
    "ServerEnvironment",
    "ServerNotReadyError",
    "ServerRequirements",
    "ServerSpec",
    "ServerStartError",
    "StackBuilder",
    "StackConfig",
    "UvNotFoundError",
    "VLLM_VENV_ENV_VAR",
    "VllmVenv",
    "VllmVenvNotFoundError",
    "build_stack_config",
    "default_gym_venv_path",
    "default_requirements_cache",
    "default_vllm_venv_path",
    "describe_environment",
    "environment_path",
    "find_gym_venv",
    "find_router",
    "find_uv",
    "find_vllm_venv",
    "free_loopback_ports",
    "locate_environment",
    "prepare_server_environment",
    "read_server_requirements",
    "resolve_environments",
    "start_router",
    "start_samplers",
    "start_serve",
    "start_vllm",
]
