"""nemogym_sdk: typed, fast, tested glue between NVIDIA NeMo Gym environments and RL trainers.

The core (records, turn parser, collation, hosts, rows, reward pass-through, GRPO
advantages, step metrics) is pure: it imports numpy and attrs, never torch, trl,
transformers, vllm or axolotl. The network layer (``AgentClient``, ``ServerDirectory``,
``Verifier``, ``reward_nemo_gym_verify``) is imported on first use, so ``import
nemogym_sdk`` stays fast and does not load aiohttp or requests. The LoRA sync names
(``LoraSync``, ``check_served_name``, ``probe_lora_support``, ``install_lora_sync``) load
the same way.

The top level holds what a trainer author uses; the rest of each module's names
(``nemogym_sdk.masks.CompletionBuilder``, ``nemogym_sdk.grpo.AdvantageStats``,
``nemogym_sdk.directory.ServerInfo`` ...) stay in their modules.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from nemogym_sdk.collate import collate
from nemogym_sdk.data import expand_groups, load_rows
from nemogym_sdk.errors import (
    ConfigError,
    DataError,
    DeadlineError,
    DiscoveryError,
    DriftError,
    LoraSyncError,
    NemoGymError,
    NotReadyError,
    ServerError,
    TransportError,
    UnknownAgentError,
    UsageError,
)
from nemogym_sdk.grpo import Advantages, Scaling, compute_advantages, group_advantages
from nemogym_sdk.hosts import base_url, normalize_host, routable_host
from nemogym_sdk.metrics import RolloutStats
from nemogym_sdk.policy import RetryPolicy, SamplingParams, Timeouts
from nemogym_sdk.records import (
    Batch,
    DriftPolicy,
    ParseOptions,
    Rollout,
    RolloutRequest,
    RolloutStatus,
    TaskRow,
)
from nemogym_sdk.rewards import reward_env
from nemogym_sdk.turns import parse_agent_response

if TYPE_CHECKING:
    from nemogym_sdk.client import AgentClient, RawRun
    from nemogym_sdk.directory import ServerDirectory
    from nemogym_sdk.lora import (
        LoraSync,
        SyncRecord,
        check_served_name,
        install_lora_sync,
        probe_lora_support,
    )
    from nemogym_sdk.rollout_engine import (
        EngineClosedError,
        EngineOptions,
        EngineStalledError,
        EngineStep,
        RolloutEngine,
    )
    from nemogym_sdk.verify import (
        Verifier,
        VerifyItem,
        VerifyResult,
        clear_verifier_cache,
        reward_nemo_gym_verify,
        verify_stats,
    )

__version__ = "0.1.0"

_LAZY = {
    "AgentClient": "nemogym_sdk.client",
    "RawRun": "nemogym_sdk.client",
    "ServerDirectory": "nemogym_sdk.directory",
    "EngineClosedError": "nemogym_sdk.rollout_engine",
    "EngineOptions": "nemogym_sdk.rollout_engine",
    "EngineStalledError": "nemogym_sdk.rollout_engine",
    "EngineStep": "nemogym_sdk.rollout_engine",
    "RolloutEngine": "nemogym_sdk.rollout_engine",
    "LoraSync": "nemogym_sdk.lora",
    "SyncRecord": "nemogym_sdk.lora",
    "check_served_name": "nemogym_sdk.lora",
    "install_lora_sync": "nemogym_sdk.lora",
    "probe_lora_support": "nemogym_sdk.lora",
    "Verifier": "nemogym_sdk.verify",
    "VerifyItem": "nemogym_sdk.verify",
    "VerifyResult": "nemogym_sdk.verify",
    "clear_verifier_cache": "nemogym_sdk.verify",
    "reward_nemo_gym_verify": "nemogym_sdk.verify",
    "verify_stats": "nemogym_sdk.verify",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'nemogym_sdk' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "Advantages",
    "AgentClient",
    "Batch",
    "ConfigError",
    "DataError",
    "DeadlineError",
    "DiscoveryError",
    "DriftError",
    "DriftPolicy",
    "EngineClosedError",
    "EngineOptions",
    "EngineStalledError",
    "EngineStep",
    "LoraSync",
    "LoraSyncError",
    "NemoGymError",
    "NotReadyError",
    "ParseOptions",
    "RawRun",
    "RetryPolicy",
    "Rollout",
    "RolloutEngine",
    "RolloutRequest",
    "RolloutStats",
    "RolloutStatus",
    "SamplingParams",
    "Scaling",
    "ServerDirectory",
    "ServerError",
    "SyncRecord",
    "TaskRow",
    "Timeouts",
    "TransportError",
    "UnknownAgentError",
    "UsageError",
    "Verifier",
    "VerifyItem",
    "VerifyResult",
    "__version__",
    "base_url",
    "check_served_name",
    "clear_verifier_cache",
    "collate",
    "compute_advantages",
    "expand_groups",
    "group_advantages",
    "install_lora_sync",
    "load_rows",
    "normalize_host",
    "parse_agent_response",
    "probe_lora_support",
    "reward_env",
    "reward_nemo_gym_verify",
    "routable_host",
    "verify_stats",
]
