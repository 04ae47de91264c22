"""An environment's config as the stack starts it: NeMo Gym's resolution, paired with an agent.

:func:`load_environment_config` returns the one mapping :mod:`nemogym_sdk.gym.config`
builds a stack from: the config NeMo Gym's own parser resolved
(:mod:`nemogym_sdk.gym.resolve`: includes, precedence, directives, composition, defaults),
plus one thing the SDK adds: an environment whose config starts no agent is paired with
the agent its resources server accepts (``allowed_agents``, as NeMo Gym reads it): that
agent's own shipped config (``responses_api_agents/<agent>/configs/<agent>.yaml``, resolved
by NeMo Gym too), bound to this resources server.
"""

from __future__ import annotations

import copy
import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any

from nemogym_sdk.gym.locate import GymVenv
from nemogym_sdk.gym.resolve import ResolvedEnvironment, resolve_environments
from nemogym_sdk.gym.specs import AGENTS, ENVIRONMENT_SERVERS, RESOURCES
from nemogym_sdk.wire import SERVER_TYPES

__all__ = [
    "deep_merge",
    "environment_config",
    "load_environment_config",
    "server_type_of",
]

logger = logging.getLogger(__name__)

_CONFIG_PATHS = "config_paths"


def load_environment_config(
    venv: GymVenv, environment: str, *, env_path: Sequence[str | os.PathLike[str]] | None = None
) -> dict[str, Any]:
    """An environment's config as NeMo Gym resolves it, paired with an agent when it
    starts none; ``ConfigError`` if it is absent or NeMo Gym refuses it. ``env_path``: the
    environment search path (``None``: ``$NEMOGYM_ENV_PATH``)."""
    (resolved,) = resolve_environments(venv, [environment], env_path=env_path)
    return environment_config(resolved)


def environment_config(resolved: ResolvedEnvironment) -> dict[str, Any]:
    """``resolved``'s config, with the agent :func:`_paired_agents` pairs it with when it
    starts none (the config's own keys win; its ``config_paths`` lists both)."""
    config = copy.deepcopy(dict(resolved.config))
    if any(server_type_of(block) == AGENTS for block in config.values()):
        return config
    paired = _paired_agents(resolved)
    merged = deep_merge(paired, config)
    included = [*(config.get(_CONFIG_PATHS) or []), *(paired.get(_CONFIG_PATHS) or [])]
    if included:
        merged[_CONFIG_PATHS] = list(dict.fromkeys(included))
    return merged


def _paired_agents(resolved: ResolvedEnvironment) -> dict[str, Any]:
    """The agent an agent-less environment runs with, from its ``allowed_agents``.

    NeMo Gym ships some environments (``gdpval``, the SWE ones) as a resources server
    alone, naming the agents that score it correctly in ``allowed_agents``; the agent's own
    config binds it to the resources server. The first allowed agent that ships a config
    is taken: its agent instances of that type (bound to this resources server unless
    they name one of it, their own datasets dropped so the environment's example rows are
    the examples), the model servers and plain keys of its config. Nothing, when no
    allowed agent ships a config.
    """
    config = resolved.config
    resources = [name for name, block in config.items() if server_type_of(block) == RESOURCES]
    for candidate in resolved.candidates:
        paired = _agent_blocks(candidate.config, candidate.agent)
        for block in paired.values():
            if server_type_of(block) == AGENTS:
                ((_, agent_inner),) = block[AGENTS].items()
                reference = agent_inner.get("resources_server")
                if not isinstance(reference, dict) or reference.get("name") not in resources:
                    agent_inner["resources_server"] = {
                        "type": RESOURCES,
                        "name": candidate.resources_server,
                    }
                agent_inner.pop("datasets", None)
        if any(server_type_of(block) == AGENTS for block in paired.values()):
            logger.info(
                "%s: its config starts no agent; paired with %s (allowed_agents) from %s",
                resolved.name,
                candidate.agent,
                candidate.path,
            )
            return paired
    return {}


def _agent_blocks(config: Mapping[str, Any], agent: str) -> dict[str, Any]:
    """The parts of an agent's own config a pairing keeps: its ``agent`` instances, model
    servers and plain keys (not its resources servers or environment servers)."""
    kept: dict[str, Any] = {}
    for name, block in config.items():
        server_type = server_type_of(block)
        if server_type == AGENTS and next(iter(block[AGENTS])) != agent:
            continue
        if server_type in (RESOURCES, ENVIRONMENT_SERVERS):
            continue
        kept[name] = copy.deepcopy(block)
    return kept


def server_type_of(block: Any) -> str | None:
    """The server type of a top-level block, or ``None`` if it is not a server instance."""
    if not isinstance(block, Mapping) or len(block) != 1:
        return None
    ((server_type, impls),) = block.items()
    if server_type not in SERVER_TYPES or not isinstance(impls, Mapping) or len(impls) != 1:
        return None
    (inner,) = impls.values()
    return str(server_type) if isinstance(inner, Mapping) and "entrypoint" in inner else None


def deep_merge(base: Mapping[str, Any], update: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``update`` merged in, mappings recursively, everything copied
    (``overrides`` over the stack's config; lists are replaced, as OmegaConf merges them)."""
    merged = {key: copy.deepcopy(value) for key, value in base.items()}
    for key, value in update.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged
