"""nemogym_sdk: typed, fast, tested glue between NVIDIA NeMo Gym environments and RL trainers.

The core (records, turn parser, env-mask builder, collation, hosts, rows, reward
pass-through) is pure: it imports numpy and attrs, never torch, trl, transformers,
vllm or axolotl.
"""

from __future__ import annotations

from nemogym_sdk.collate import collate
from nemogym_sdk.data import expand_groups, load_rows, read_rows
from nemogym_sdk.errors import (
    ConfigError,
    DataError,
    DeadlineError,
    DiscoveryError,
    DriftError,
    NemoGymError,
    NotReadyError,
    RowError,
    ServerError,
    TransportError,
    UnknownAgentError,
)
from nemogym_sdk.hosts import base_url, normalize_host, routable_host, split_host_port
from nemogym_sdk.masks import Completion, CompletionBuilder
from nemogym_sdk.records import (
    Batch,
    DriftPolicy,
    DriftReport,
    Rollout,
    RolloutRequest,
    RolloutStatus,
    TaskRow,
)
from nemogym_sdk.rewards import reward_env
from nemogym_sdk.turns import parse_agent_response

__version__ = "0.1.0"

__all__ = [
    "Batch",
    "Completion",
    "CompletionBuilder",
    "ConfigError",
    "DataError",
    "DeadlineError",
    "DiscoveryError",
    "DriftError",
    "DriftPolicy",
    "DriftReport",
    "NemoGymError",
    "NotReadyError",
    "Rollout",
    "RolloutRequest",
    "RolloutStatus",
    "RowError",
    "ServerError",
    "TaskRow",
    "TransportError",
    "UnknownAgentError",
    "__version__",
    "base_url",
    "collate",
    "expand_groups",
    "load_rows",
    "normalize_host",
    "parse_agent_response",
    "read_rows",
    "reward_env",
    "routable_host",
    "split_host_port",
]
