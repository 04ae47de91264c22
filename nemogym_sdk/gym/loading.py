"""Read an environment's shipped config: variants, includes, and agent pairing.

:func:`load_environment_config` returns the one mapping :mod:`nemogym_sdk.gym.config` builds
a stack from. On the way it

* finds the config: ``configs/<env>.yaml``, or a variant ``<dir>:<config>``
  (:func:`~nemogym_sdk.gym.locate.split_environment_name`);
* merges the configs it includes (``config_paths``) with NeMo Gym's precedence, and a
  variant that only adjusts the directory's own config over that config;
* carries out ``_inherit_from``, ``_copy`` and ``_delete_key``
  (:mod:`~nemogym_sdk.gym.directives`);
* pairs an environment whose config starts no agent with the agent its resources server
  accepts (``allowed_agents``): that agent's own shipped config
  (``responses_api_agents/<agent>/configs/<agent>.yaml``), bound to this resources server;
"""

from __future__ import annotations

import copy
import difflib
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from nemogym_sdk.errors import ConfigError
from nemogym_sdk.gym.directives import deep_merge, resolve_directives
from nemogym_sdk.gym.locate import GymVenv, locate_environment, sdk_environment_names
from nemogym_sdk.gym.specs import AGENTS, ENVIRONMENT_SERVERS, MODELS, RESOURCES

__all__ = [
    "SERVER_TYPES",
    "allowed_agents",
    "environment_config_path",
    "load_environment_config",
    "server_type_of",
]

logger = logging.getLogger(__name__)

SERVER_TYPES = (MODELS, RESOURCES, AGENTS, ENVIRONMENT_SERVERS)
"""The top-level server types of a NeMo Gym config."""
_ALLOWED_AGENTS = "allowed_agents"


def environment_config_path(venv: GymVenv, environment: str) -> Path:
    """``configs/<env>.yaml`` in the environment's directory (venv or SDK)."""
    return locate_environment(venv, environment).config_path


def load_environment_config(venv: GymVenv, environment: str) -> dict[str, Any]:
    """Read an environment's shipped config; ``ConfigError`` if it is absent or unusable.

    Configs it includes (``config_paths``, relative to the venv's site-packages, e.g. an
    agent's own config) are merged first, each overridden by the config that includes it,
    siblings in the order listed: NeMo Gym's precedence. A variant that only adjusts the
    servers of the directory's own config is merged over that config (as NeMo Gym's docs
    chain them); then directives are carried out (:mod:`~nemogym_sdk.gym.directives`). A
    config that starts no agent gets the one its resources server accepts (see
    :func:`_paired_agents`).
    """
    location = locate_environment(venv, environment)
    path = location.config_path
    if not path.is_file():
        variants = sorted(p.stem for p in location.directory.glob("configs/*.yaml"))
        if variants:
            raise ConfigError(
                f"environment {environment!r} has no config {path.name}; pick one of its "
                f"configs as '{location.directory.name}:<config>': {', '.join(variants)}"
            )
        known = sorted(
            {p.parent.parent.name for p in venv.site_packages.glob(f"{RESOURCES}/*/configs/*.yaml")}
            | set(sdk_environment_names())
        )
        close = difflib.get_close_matches(environment, known, n=3)
        hint = f"; did you mean {', '.join(map(repr, close))}?" if close else ""
        raise ConfigError(
            f"unknown NeMo Gym environment {environment!r}: {path} does not exist "
            f"({len(known)} environments ship configs{hint})"
        )
    roots = (location.root, venv.site_packages)
    loaded = _load_with_includes(path, roots, ())
    own = location.directory / "configs" / f"{location.directory.name}.yaml"
    if path != own and own.is_file() and _is_overlay(loaded):
        loaded = deep_merge(_load_with_includes(own, roots, ()), loaded)
    loaded = resolve_directives(loaded, str(path))
    if not any(server_type_of(block) == AGENTS for block in loaded.values()):
        loaded = deep_merge(_paired_agents(venv, environment, loaded), loaded)
    return loaded


def _is_overlay(config: Mapping[str, Any]) -> bool:
    """Whether a variant only adjusts servers defined elsewhere: some server block in it
    has no ``entrypoint`` (``math_with_judge:math_with_local_judge`` sets the judge of the
    ``math_with_judge`` server that ``configs/math_with_judge.yaml`` defines)."""
    return any(
        isinstance(block, Mapping)
        and len(block) == 1
        and next(iter(block)) in SERVER_TYPES
        and server_type_of(block) is None
        for block in config.values()
    )


def _paired_agents(venv: GymVenv, environment: str, loaded: Mapping[str, Any]) -> dict[str, Any]:
    """The agent an agent-less environment runs with, from its ``allowed_agents``.

    NeMo Gym ships some environments (``gdpval``) as a resources server alone, naming the
    agents that score it correctly in ``allowed_agents``; the agent's own config binds
    it to the resources server. The first allowed agent that ships a config is taken: its
    agent instances of that type (bound to this resources server, their own datasets
    dropped so the environment's example rows are the examples), the model servers and
    plain keys of its config. Nothing, when no allowed agent ships a config.
    """
    resources = [name for name, block in loaded.items() if server_type_of(block) == RESOURCES]
    for instance, agent in allowed_agents(loaded):
        path = venv.server_dir(AGENTS, agent) / "configs" / f"{agent}.yaml"
        if not path.is_file():
            continue
        paired = _agent_blocks(_load_with_includes(path, (venv.site_packages,), ()), agent)
        for block in paired.values():
            if server_type_of(block) == AGENTS:
                ((_, agent_inner),) = block[AGENTS].items()
                reference = agent_inner.get("resources_server")
                if not isinstance(reference, dict) or reference.get("name") not in resources:
                    agent_inner["resources_server"] = {"type": RESOURCES, "name": instance}
                agent_inner.pop("datasets", None)
        if any(server_type_of(block) == AGENTS for block in paired.values()):
            logger.info(
                "%s: its config starts no agent; paired with %s (allowed_agents) from %s",
                environment,
                agent,
                path,
            )
            return paired
    return {}


def allowed_agents(config: Mapping[str, Any]) -> list[tuple[str, str]]:
    """``(resources server instance, agent type)`` for each agent a resources server of
    ``config`` names in ``allowed_agents``, in config order (a bare string is one agent)."""
    found = []
    for instance, block in config.items():
        if server_type_of(block) != RESOURCES:
            continue
        ((_, inner),) = block[RESOURCES].items()
        allowed = inner.get(_ALLOWED_AGENTS) or []
        found += [(instance, str(a)) for a in ([allowed] if isinstance(allowed, str) else allowed)]
    return found


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


def _load_with_includes(
    path: Path, roots: tuple[Path, ...], chain: tuple[Path, ...]
) -> dict[str, Any]:
    """``path``'s YAML with its ``config_paths`` merged in under it (recursively).

    A relative include is looked up under each of ``roots`` in turn.
    """
    if path in chain:
        cycle = " -> ".join(str(p) for p in (*chain, path))
        raise ConfigError(f"config_paths include themselves: {cycle}")
    if not path.is_file():
        raise ConfigError(f"{chain[-1] if chain else path}: included config {path} does not exist")
    loaded = yaml.safe_load(path.read_text())
    if not isinstance(loaded, dict):
        raise ConfigError(f"{path} is not a YAML mapping")
    includes = loaded.pop("config_paths", None) or []
    if not isinstance(includes, list) or not all(isinstance(i, str) for i in includes):
        raise ConfigError(f"{path}: config_paths must be a list of paths, got {includes!r}")
    merged: dict[str, Any] = {}
    for include in includes:
        candidates = (
            [Path(include)] if Path(include).is_absolute() else [r / include for r in roots]
        )
        included = next((c for c in candidates if c.is_file()), candidates[0])
        merged = deep_merge(merged, _load_with_includes(included, roots, (*chain, path)))
    return deep_merge(merged, loaded)


def server_type_of(block: Any) -> str | None:
    """The server type of a top-level block, or ``None`` if it is not a server instance."""
    if not isinstance(block, Mapping) or len(block) != 1:
        return None
    ((server_type, impls),) = block.items()
    if server_type not in SERVER_TYPES or not isinstance(impls, Mapping) or len(impls) != 1:
        return None
    (inner,) = impls.values()
    return str(server_type) if isinstance(inner, Mapping) and "entrypoint" in inner else None
