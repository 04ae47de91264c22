"""Build the global config of a stack: NeMo Gym's resolution plus what the SDK adds.

NeMo Gym servers read one global config (YAML in ``NEMO_GYM_CONFIG_DICT``) and find
their own block under the top-level key named by ``NEMO_GYM_CONFIG_PATH``. A block is
``<instance>: {<server_type>: {<impl>: {entrypoint, host, port, ...}}}`` and servers
refer to each other with ``{type: <server_type>, name: <instance>}``.

Each environment's config comes resolved by NeMo Gym's own parser
(:mod:`nemogym_sdk.gym.resolve`; paired with an agent when it starts none:
:mod:`nemogym_sdk.gym.loading`). :func:`build_stack_config` adds what the SDK owns:

* drops its ``environment_servers`` instances (NeMo Gym's ``legacy_agent`` relays, also
  the ones its parser generates) unless asked to keep them (``environment_servers``): in
  0.7.0 they only front the agent for NeMo Gym's own rollout collection and ``gym eval
  run`` (posting to the agent's ``/run`` gives the same result), and the relay does not
  declare ``ray_enabled``, so started as it is it would start a Ray cluster of its own
  (``GymStack`` starts it without one: :mod:`nemogym_sdk.gym.relay_main`);
* adds one ``vllm_model`` instance (``policy_model`` by default, the name the shipped
  agents refer to) configured for training from a :class:`PolicyModel`, in place of a
  model server of that name the environment defines as a default;
* starts every other model server the environment needs (judges, user simulators,
  reward models) as a ``vllm_model`` on the judge endpoint (:mod:`nemogym_sdk.gym.judges`);
* keeps the other top-level keys (NeMo Gym's defaults, the environment's variables such
  as ``judge_base_url: null``) as globals, which must agree across environments, and sets
  the ones the stack owns: ``head_server``, ``dry_run``, the ``policy_*`` and ``judge_*``
  keys the shipped model configs interpolate, ``results_dir``/``cache_dir``;
* deep-merges caller ``overrides``, then pins every server without a host/port to
  127.0.0.1 and a free port of ``port_range_low``-``port_range_high``, lists them all in
  ``disallowed_ports`` (as NeMo Gym's parser does), then checks that every server
  reference points at an instance of the right type.

Everything here but the resolution is pure (no processes); ports come from an injectable
allocator.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from nemogym_sdk.errors import ConfigError
from nemogym_sdk.gym.judges import (
    declared_model,
    judge_server_block,
    wire_model_dependencies,
)
from nemogym_sdk.gym.loading import deep_merge, environment_config, server_type_of
from nemogym_sdk.gym.locate import GymVenv
from nemogym_sdk.gym.resolve import ResolvedEnvironment, resolve_environments
from nemogym_sdk.gym.specs import (
    AGENTS,
    ENVIRONMENT_SERVERS,
    MODELS,
    RESOURCES,
    EnvironmentSetup,
    PolicyModel,
    ServerSpec,
    StackConfig,
)
from nemogym_sdk.processes.ports import LOOPBACK, PORT_RANGE, free_loopback_ports
from nemogym_sdk.wire import SERVER_TYPES

__all__ = [
    "STACK_KEYS",
    "build_stack_config",
    "dataset_paths",
]

_KEPT_TYPES = (MODELS, RESOURCES, AGENTS)
# Start order: what others call first, so a caller never waits on a callee.
_START_ORDER = {MODELS: 0, RESOURCES: 1, AGENTS: 2, ENVIRONMENT_SERVERS: 3}
_CONFIG_PATHS = "config_paths"

STACK_KEYS = frozenset(
    {
        "head_server",
        "disallowed_ports",
        "dry_run",
        "results_dir",
        "cache_dir",
        "uv_cache_dir",
        "uv_venv_dir",
        "policy_base_url",
        "policy_api_key",
        "policy_model_name",
    }
)
"""Top-level keys of NeMo Gym's resolution the stack sets itself (addresses, the policy,
the working directories; NeMo Gym derives its defaults for these from the parsing
process's cwd). ``uv_*`` serve NeMo Gym's own per-server venv set-up, which the stack
does not use: they are left out."""


@attrs.define(kw_only=True)
class _Parts:
    """What the environments contribute, gathered before the stack's own servers join."""

    servers: dict[str, Any] = attrs.field(factory=dict)
    owner: dict[str, str | None] = attrs.field(factory=dict)
    variables: dict[str, tuple[str, Any]] = attrs.field(factory=dict)
    declared_models: dict[str, str] = attrs.field(factory=dict)
    dropped: dict[str, list[str]] = attrs.field(factory=dict)
    config_paths: list[str] = attrs.field(factory=list)


def build_stack_config(
    venv: GymVenv,
    environments: Sequence[str],
    model: PolicyModel,
    *,
    judge: PolicyModel | None = None,
    workdir: Path | None = None,
    default_max_steps: int | None = None,
    overrides: Mapping[str, Any] | None = None,
    allocate_ports: Callable[[int], Sequence[int]] | None = None,
    environment_servers: bool = False,
    env_path: Sequence[str | os.PathLike[str]] | None = None,
) -> StackConfig:
    """Resolve the global config that runs ``environments`` against ``model``.

    ``judge`` is the OpenAI-compatible endpoint every other model server the environments
    need is pointed at (see :func:`~nemogym_sdk.gym.judges.wire_model_dependencies`);
    ``None`` means the policy's own backend. ``default_max_steps`` is written into agents
    whose config has no ``max_steps`` (``simple_agent`` is unbounded by default).
    ``overrides`` is deep-merged into the result last (e.g. ``{"blackjack_gymnasium_agent":
    {"responses_api_agents": {"gymnasium_agent": {"max_steps": 2}}}}``). ``workdir``
    receives NeMo Gym's ``results_dir`` and ``cache_dir``. ``allocate_ports(n)`` returns
    ``n`` ports, one for each server (and the head server) whose port ``overrides`` did
    not pin; default :func:`free_loopback_ports` in the config's port range. Overrides may
    also add server instances, which are started with the rest. All environments are
    resolved in one request to the NeMo Gym worker (none when cached).
    ``environment_servers`` keeps the environment servers (the relays NeMo Gym's own
    rollout collection posts ``/run`` to) instead of dropping them. ``env_path`` is the
    environment search path, looked in before the SDK's and NeMo Gym's environments
    (``None``: ``$NEMOGYM_ENV_PATH``; see :func:`~nemogym_sdk.gym.locate.locate_environment`).
    """
    if isinstance(environments, str) or not environments:
        raise ConfigError("at least one environment is required (a sequence of names)")
    if len(set(environments)) != len(environments):
        raise ConfigError(f"environments listed twice: {list(environments)}")
    if default_max_steps is not None and default_max_steps < 1:
        raise ConfigError(f"default_max_steps must be >= 1, got {default_max_steps}")
    resolved = resolve_environments(venv, environments, env_path=env_path)
    parts = _Parts()
    kept = (*_KEPT_TYPES, ENVIRONMENT_SERVERS) if environment_servers else _KEPT_TYPES
    for environment in resolved:
        _collect(parts, environment, model, kept)
    _add_models(parts, model, judge)
    if default_max_steps is not None:
        _fill_max_steps(parts.servers, default_max_steps)
    globals_ = _globals(parts, model, judge if judge is not None else model, workdir)
    config = deep_merge({**globals_, **parts.servers}, overrides or {})
    _pin_addresses(config, allocate_ports or _range_allocator(config))
    servers = _server_specs(config, parts.owner, kept)
    _check_references(config, servers)
    head = config["head_server"]
    return StackConfig(
        global_config=config,
        servers=servers,
        environments=tuple(_environment_setup(e, parts, config, servers) for e in resolved),
        head_host=str(head["host"]),
        head_port=int(head["port"]),
    )


def _collect(
    parts: _Parts,
    resolved: ResolvedEnvironment,
    model: PolicyModel,
    kept: tuple[str, ...] = _KEPT_TYPES,
) -> None:
    """Sort one environment's top-level keys into servers, models to wire and globals."""
    environment = resolved.name
    dropped = parts.dropped.setdefault(environment, [])
    for instance, block in environment_config(resolved).items():
        server_type = server_type_of(block)
        if instance == _CONFIG_PATHS:
            parts.config_paths += [p for p in block or [] if p not in parts.config_paths]
        elif server_type is None:
            if instance not in STACK_KEYS:
                _add_variable(parts.variables, environment, instance, block)
        elif server_type not in kept:
            dropped.append(instance)
        elif server_type == MODELS and instance == model.instance_name:
            continue  # a default policy (nemo_user_sim's): the stack's policy replaces it
        elif server_type == MODELS:
            # Replaced by a judge block; shared by every environment naming it.
            parts.declared_models[instance] = declared_model(environment, instance, block)
        elif instance in parts.servers:
            raise ConfigError(
                f"server instance {instance!r} is defined by both "
                f"{parts.owner[instance]!r} and {environment!r}"
            )
        else:
            parts.servers[instance] = copy.deepcopy(block)
            parts.owner[instance] = environment


def _add_models(parts: _Parts, model: PolicyModel, judge: PolicyModel | None) -> None:
    """The policy's ``vllm_model`` and a judge block for every model dependency."""
    if model.instance_name in parts.servers:
        raise ConfigError(
            f"{parts.owner[model.instance_name]!r} already defines {model.instance_name!r} "
            "as a server that is not a model server; give the PolicyModel another instance_name"
        )
    judge_block = judge_server_block(judge if judge is not None else model)
    for instance in wire_model_dependencies(
        parts.servers, model.instance_name, parts.declared_models, rename_policy=judge is not None
    ):
        parts.servers[instance] = {MODELS: {"vllm_model": copy.deepcopy(judge_block)}}
        parts.owner[instance] = None
    parts.servers[model.instance_name] = {MODELS: {"vllm_model": model.server_block()}}
    parts.owner[model.instance_name] = None


def _fill_max_steps(servers: Mapping[str, Any], max_steps: int) -> None:
    for instance, block in servers.items():
        server_type, _, inner = _inner(instance, block)
        if server_type == AGENTS and inner.get("max_steps") is None:
            inner["max_steps"] = max_steps


def _globals(
    parts: _Parts, model: PolicyModel, judge: PolicyModel, workdir: Path | None
) -> dict[str, Any]:
    """The top-level keys: NeMo Gym's defaults and the environments' variables, then the
    ones the stack owns."""
    globals_: dict[str, Any] = {name: value for name, (_, value) in parts.variables.items()}
    if parts.config_paths:
        globals_[_CONFIG_PATHS] = list(parts.config_paths)
    globals_.update(
        {
            "head_server": {"host": LOOPBACK},
            "dry_run": False,
            "policy_base_url": model.base_url,
            "policy_api_key": model.api_key,
            "policy_model_name": model.model,
            # What the shipped judge blocks interpolate (${judge_base_url} ...).
            "judge_base_url": judge.base_url,
            "judge_api_key": judge.api_key,
            "judge_model_name": judge.model,
        }
    )
    if workdir is not None:
        globals_["results_dir"] = str(workdir / "results")
        globals_["cache_dir"] = str(workdir / "cache")
    return globals_


def _add_variable(
    variables: dict[str, tuple[str, Any]], environment: str, key: str, value: Any
) -> None:
    """Keep a top-level key that is not a server (``judge_base_url: null`` ...) as a global."""
    if isinstance(value, Mapping) and len(value) == 1 and next(iter(value)) in SERVER_TYPES:
        raise ConfigError(
            f"{environment}: top-level key {key!r} is not a server instance: expected "
            "{<server_type>: {<impl>: {entrypoint: ..., ...}}}"
        )
    if key in variables and variables[key][1] != value:
        raise ConfigError(
            f"top-level key {key!r} is {variables[key][1]!r} in {variables[key][0]!r} but "
            f"{value!r} in {environment!r}; set it with overrides"
        )
    variables[key] = (environment, copy.deepcopy(value))


def _range_allocator(config: Mapping[str, Any]) -> Callable[[int], Sequence[int]]:
    low = int(config.get("port_range_low") or PORT_RANGE[0])
    high = int(config.get("port_range_high") or PORT_RANGE[1])
    return lambda count: free_loopback_ports(count, (low, high))


def _pin_addresses(config: dict[str, Any], allocate_ports: Callable[[int], Sequence[int]]) -> None:
    """Give the head server and every server without a host/port a loopback address, and
    list every port in ``disallowed_ports``."""
    head = config.get("head_server")
    if not isinstance(head, dict):
        raise ConfigError(f"head_server must be a mapping, got {head!r}")
    blocks: list[dict[str, Any]] = [head]
    for instance, block in config.items():
        if server_type_of(block) is not None:
            blocks.append(_inner(instance, block)[2])
    missing = [block for block in blocks if block.get("port") is None]
    ports = list(allocate_ports(len(missing)))
    if len(ports) != len(missing) or len(set(ports)) != len(ports):
        raise ConfigError(f"port allocator returned {ports}, need {len(missing)} distinct ports")
    for block, port in zip(missing, ports, strict=True):
        block["port"] = port
    for block in blocks:
        block.setdefault("host", LOOPBACK)
    config["disallowed_ports"] = [block["port"] for block in blocks]


def _inner(instance: str, block: Any) -> tuple[str, str, dict[str, Any]]:
    """``(server_type, impl, server_config)`` of a server instance block."""
    server_type = server_type_of(block)
    if server_type is None:
        raise ConfigError(
            f"{instance!r} is not a server instance: expected "
            "{<server_type>: {<impl>: {entrypoint: ..., ...}}}"
        )
    ((impl, inner),) = block[server_type].items()
    return server_type, str(impl), inner


def _server_specs(
    config: Mapping[str, Any],
    owner: Mapping[str, str | None],
    kept: tuple[str, ...] = _KEPT_TYPES,
) -> tuple[ServerSpec, ...]:
    specs = []
    for instance, block in config.items():
        if server_type_of(block) is None:
            continue
        server_type, impl, inner = _inner(instance, block)
        if server_type not in kept:
            raise ConfigError(
                f"{instance!r} is an {server_type} instance; the stack does not start those"
            )
        try:
            port = int(inner["port"])
        except (TypeError, ValueError) as exc:
            raise ConfigError(
                f"{instance}: port must be an integer, got {inner['port']!r}"
            ) from exc
        specs.append(
            ServerSpec(
                instance=instance,
                server_type=server_type,
                impl=impl,
                entrypoint=str(inner["entrypoint"]),
                host=str(inner["host"]),
                port=port,
                environment=owner.get(instance),
            )
        )
    specs.sort(key=lambda s: _START_ORDER[s.server_type])
    return tuple(specs)


def _check_references(config: Mapping[str, Any], servers: tuple[ServerSpec, ...]) -> None:
    defined = {(s.server_type, s.instance) for s in servers}
    for spec in servers:
        for ref_type, ref_name in _references(config[spec.instance]):
            if (ref_type, ref_name) not in defined:
                available = sorted(name for t, name in defined if t == ref_type) or ["(none)"]
                raise ConfigError(
                    f"server {spec.instance!r} references {ref_type}/{ref_name!r}, which the "
                    f"stack does not start; available {ref_type}: {', '.join(available)}"
                )


def _references(node: Any) -> Iterable[tuple[str, str]]:
    if isinstance(node, Mapping):
        if set(node) == {"type", "name"} and node["type"] in SERVER_TYPES:
            yield str(node["type"]), str(node["name"])
            return
        for value in node.values():
            yield from _references(value)
    elif isinstance(node, list):
        for value in node:
            yield from _references(value)


def _environment_setup(
    resolved: ResolvedEnvironment,
    parts: _Parts,
    config: Mapping[str, Any],
    servers: tuple[ServerSpec, ...],
) -> EnvironmentSetup:
    location = resolved.location
    mine = [s for s in servers if s.environment == resolved.name]
    agents = [s for s in mine if s.server_type == AGENTS]
    paths = dataset_paths(resolved, [_inner(a.instance, config[a.instance])[2] for a in agents])
    return EnvironmentSetup(
        name=resolved.name,
        config_path=location.config_path,
        agents=tuple(a.instance for a in agents),
        agent_impls=tuple(a.impl for a in agents),
        resources_servers=tuple(s.instance for s in mine if s.server_type == RESOURCES),
        dropped=tuple(parts.dropped.get(resolved.name, ())),
        example_path=paths.get("example", location.directory / "data" / "example.jsonl"),
        train_path=paths.get("train"),
        allowed_agents=resolved.allowed_agents,
    )


def dataset_paths(
    resolved: ResolvedEnvironment, agent_configs: Iterable[Mapping[str, Any]]
) -> dict[str, Path]:
    """Dataset type (``example``, ``train`` ...) -> the first such dataset's file, as NeMo
    Gym resolves its ``jsonl_fpath`` (:attr:`ResolvedEnvironment.datasets`); the agents'
    inner blocks are given in config order."""
    paths: dict[str, Path] = {}
    for inner in agent_configs:
        for dataset in inner.get("datasets") or []:
            if isinstance(dataset, Mapping) and dataset.get("jsonl_fpath"):
                fpath = str(dataset["jsonl_fpath"])
                found = resolved.datasets.get(fpath, resolved.location.resolve(fpath))
                paths.setdefault(str(dataset.get("type")), found)
    return paths
