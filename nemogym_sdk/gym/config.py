"""Build the resolved NeMo Gym global config for a set of shipped environments.

NeMo Gym servers read one global config (YAML in ``NEMO_GYM_CONFIG_DICT``) and find
their own block under the top-level key named by ``NEMO_GYM_CONFIG_PATH``. A block is
``<instance>: {<server_type>: {<impl>: {entrypoint, host, port, ...}}}`` and servers
refer to each other with ``{type: <server_type>, name: <instance>}``.

What :func:`build_stack_config` does with an environment's shipped
``configs/<env>.yaml`` (in ``resources_servers/<env>`` of the NeMo Gym venv, or in
``nemogym_sdk/gym/envs/<env>`` for environments shipped with the SDK; see
:func:`~nemogym_sdk.gym.locate.locate_environment`):

* keeps its resources server, agent and model server instances verbatim;
* drops its ``environment_servers`` instances: in 0.7.0 they only front the agent for
  ``gym eval run`` (posting to the agent's ``/run`` gives the same result), and the
  ``legacy_agent`` relay does not declare ``ray_enabled``, so started on its own it
  would start a Ray cluster of its own;
* adds one ``vllm_model`` instance (``policy_model`` by default, the name the shipped
  agents refer to) configured for training from a :class:`PolicyModel`;
* fills the global keys a server reads at start-up (``head_server``, ``dry_run``, the
  ``policy_*`` keys the shipped model configs interpolate, ``results_dir``/``cache_dir``);
* deep-merges caller ``overrides``, then pins every server without a host/port to
  127.0.0.1 and a free port, then checks that every server reference points at an
  instance of the right type.

Everything here is pure (no processes); ports come from an injectable allocator.
"""

from __future__ import annotations

import copy
import difflib
import random
import socket
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from nemogym_sdk.errors import ConfigError
from nemogym_sdk.gym.locate import (
    EnvironmentLocation,
    GymVenv,
    locate_environment,
    sdk_environment_names,
)
from nemogym_sdk.gym.specs import (
    AGENTS,
    ENVIRONMENT_SERVERS,
    LOOPBACK,
    MODELS,
    RESOURCES,
    EnvironmentSetup,
    PolicyModel,
    ServerSpec,
    StackConfig,
)

_SERVER_TYPES = (MODELS, RESOURCES, AGENTS, ENVIRONMENT_SERVERS)
_KEPT_TYPES = (MODELS, RESOURCES, AGENTS)
# Start order: what others call first, so a caller never waits on a callee.
_START_ORDER = {MODELS: 0, RESOURCES: 1, AGENTS: 2}
_UNSUPPORTED_KEYS = ("_inherit_from", "_copy", "_delete_key")
_UNSUPPORTED_INTERPOLATIONS = ("${inherit_from:", "${copy:")

__all__ = [
    "PORT_RANGE",
    "build_stack_config",
    "dataset_paths",
    "environment_config_path",
    "free_loopback_ports",
    "load_environment_config",
]


PORT_RANGE = (10001, 20000)
"""Where ports are picked: NeMo Gym's own default range, below Linux's ephemeral ports
(32768-60999), so an outgoing connection cannot take a port between pick and bind."""


def free_loopback_ports(count: int, port_range: tuple[int, int] = PORT_RANGE) -> list[int]:
    """``count`` distinct ports of ``port_range`` that can be bound on 127.0.0.1 right now.

    Candidates are tried in random order (so concurrent stacks rarely pick the same
    ones), each by binding it; a port in use is skipped.
    """
    low, high = port_range
    candidates = list(range(low, high + 1))
    random.SystemRandom().shuffle(candidates)
    ports: list[int] = []
    for port in candidates:
        if len(ports) == count:
            break
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((LOOPBACK, port))
            except OSError:
                continue
        ports.append(port)
    if len(ports) < count:
        raise ConfigError(f"only {len(ports)} of {count} ports free in {low}-{high}")
    return ports


def environment_config_path(venv: GymVenv, environment: str) -> Path:
    """``configs/<env>.yaml`` in the environment's directory (venv or SDK)."""
    return locate_environment(venv, environment).config_path


def load_environment_config(venv: GymVenv, environment: str) -> dict[str, Any]:
    """Read an environment's shipped config; ``ConfigError`` if it is absent or unusable."""
    path = environment_config_path(venv, environment)
    if not path.is_file():
        known = sorted(
            {
                p.parent.parent.name
                for p in venv.site_packages.glob(f"{RESOURCES}/*/configs/*.yaml")
                if p.stem == p.parent.parent.name
            }.union(sdk_environment_names())
        )
        close = difflib.get_close_matches(environment, known, n=3)
        hint = f"; did you mean {', '.join(map(repr, close))}?" if close else ""
        raise ConfigError(
            f"unknown NeMo Gym environment {environment!r}: {path} does not exist "
            f"({len(known)} environments ship a config of their own name{hint})"
        )
    loaded = yaml.safe_load(path.read_text())
    if not isinstance(loaded, dict):
        raise ConfigError(f"{path} is not a YAML mapping")
    if "config_paths" in loaded:
        raise ConfigError(f"{path} includes other configs (config_paths), which is not supported")
    _reject_directives(loaded, str(path))
    return loaded


def build_stack_config(
    venv: GymVenv,
    environments: Sequence[str],
    model: PolicyModel,
    *,
    workdir: Path | None = None,
    default_max_steps: int | None = None,
    overrides: Mapping[str, Any] | None = None,
    allocate_ports: Callable[[int], Sequence[int]] = free_loopback_ports,
) -> StackConfig:
    """Resolve the global config that runs ``environments`` against ``model``.

    ``default_max_steps`` is written into agents whose config has no ``max_steps``
    (``simple_agent`` is unbounded by default). ``overrides`` is deep-merged into the
    result last (e.g. ``{"blackjack_gymnasium_agent": {"responses_api_agents":
    {"gymnasium_agent": {"max_steps": 2}}}}``). ``workdir`` receives NeMo Gym's
    ``results_dir`` and ``cache_dir``. ``allocate_ports(n)`` returns ``n`` ports, one
    for each server (and the head server) whose port ``overrides`` did not pin.
    Overrides may also add server instances (a judge model, say), which are started
    with the rest.
    """
    if not environments:
        raise ConfigError("at least one environment is required")
    if len(set(environments)) != len(environments):
        raise ConfigError(f"environments listed twice: {list(environments)}")

    config: dict[str, Any] = {}
    owner: dict[str, str | None] = {}
    partial: list[tuple[EnvironmentLocation, list[str]]] = []
    for environment in environments:
        location = locate_environment(venv, environment)
        shipped = load_environment_config(venv, environment)
        dropped: list[str] = []
        for instance, block in shipped.items():
            server_type = _server_type(block)
            if server_type is None:
                raise ConfigError(
                    f"{environment}: top-level key {instance!r} is not a server instance"
                )
            if server_type not in _KEPT_TYPES:
                dropped.append(instance)
                continue
            if instance in config:
                raise ConfigError(
                    f"server instance {instance!r} is defined by both {owner[instance]!r} "
                    f"and {environment!r}"
                )
            config[instance] = copy.deepcopy(block)
            owner[instance] = environment
        partial.append((location, dropped))

    if model.instance_name in config:
        raise ConfigError(
            f"{owner[model.instance_name]!r} already defines {model.instance_name!r}; "
            "give the PolicyModel another instance_name"
        )
    config[model.instance_name] = {MODELS: {"vllm_model": model.server_block()}}
    owner[model.instance_name] = None

    if default_max_steps is not None:
        if default_max_steps < 1:
            raise ConfigError(f"default_max_steps must be >= 1, got {default_max_steps}")
        for instance, block in config.items():
            server_type, _, inner = _inner(instance, block)
            if server_type == AGENTS and inner.get("max_steps") is None:
                inner["max_steps"] = default_max_steps

    globals_: dict[str, Any] = {
        "head_server": {"host": LOOPBACK},
        "dry_run": False,
        "policy_base_url": model.base_url,
        "policy_api_key": model.api_key,
        "policy_model_name": model.model,
    }
    if workdir is not None:
        globals_["results_dir"] = str(workdir / "results")
        globals_["cache_dir"] = str(workdir / "cache")
    config = _deep_merge({**globals_, **config}, overrides or {})
    _pin_addresses(config, allocate_ports)

    servers = _server_specs(config, owner)
    _check_references(config, servers)
    head = config["head_server"]
    setups = tuple(
        _environment_setup(location, dropped, config, servers) for location, dropped in partial
    )
    return StackConfig(
        global_config=config,
        servers=servers,
        environments=setups,
        head_host=str(head["host"]),
        head_port=int(head["port"]),
    )


def _pin_addresses(config: dict[str, Any], allocate_ports: Callable[[int], Sequence[int]]) -> None:
    """Give the head server and every server without a host/port a loopback address."""
    head = config.get("head_server")
    if not isinstance(head, dict):
        raise ConfigError(f"head_server must be a mapping, got {head!r}")
    blocks: list[dict[str, Any]] = [head]
    for instance, block in config.items():
        if _server_type(block) is not None:
            blocks.append(_inner(instance, block)[2])
    missing = [block for block in blocks if block.get("port") is None]
    ports = list(allocate_ports(len(missing)))
    if len(ports) != len(missing) or len(set(ports)) != len(ports):
        raise ConfigError(f"port allocator returned {ports}, need {len(missing)} distinct ports")
    for block, port in zip(missing, ports, strict=True):
        block["port"] = port
    for block in blocks:
        block.setdefault("host", LOOPBACK)


def _server_type(block: Any) -> str | None:
    """The server type of a top-level block, or ``None`` if it is not a server instance."""
    if not isinstance(block, Mapping) or len(block) != 1:
        return None
    ((server_type, impls),) = block.items()
    if server_type not in _SERVER_TYPES or not isinstance(impls, Mapping) or len(impls) != 1:
        return None
    (inner,) = impls.values()
    return str(server_type) if isinstance(inner, Mapping) and "entrypoint" in inner else None


def _inner(instance: str, block: Any) -> tuple[str, str, dict[str, Any]]:
    """``(server_type, impl, server_config)`` of a server instance block."""
    server_type = _server_type(block)
    if server_type is None:
        raise ConfigError(
            f"{instance!r} is not a server instance: expected "
            "{<server_type>: {<impl>: {entrypoint: ..., ...}}}"
        )
    ((impl, inner),) = block[server_type].items()
    return server_type, str(impl), inner


def _server_specs(
    config: Mapping[str, Any], owner: Mapping[str, str | None]
) -> tuple[ServerSpec, ...]:
    specs = []
    for instance, block in config.items():
        if _server_type(block) is None:
            continue
        server_type, impl, inner = _inner(instance, block)
        if server_type not in _KEPT_TYPES:
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
        if set(node) == {"type", "name"} and node["type"] in _SERVER_TYPES:
            yield str(node["type"]), str(node["name"])
            return
        for value in node.values():
            yield from _references(value)
    elif isinstance(node, list):
        for value in node:
            yield from _references(value)


def _environment_setup(
    location: EnvironmentLocation,
    dropped: list[str],
    config: Mapping[str, Any],
    servers: tuple[ServerSpec, ...],
) -> EnvironmentSetup:
    mine = [s for s in servers if s.environment == location.name]
    agents = [s for s in mine if s.server_type == AGENTS]
    paths = dataset_paths(location, [_inner(a.instance, config[a.instance])[2] for a in agents])
    return EnvironmentSetup(
        name=location.name,
        config_path=location.config_path,
        agents=tuple(a.instance for a in agents),
        agent_impls=tuple(a.impl for a in agents),
        resources_servers=tuple(s.instance for s in mine if s.server_type == RESOURCES),
        dropped=tuple(dropped),
        example_path=paths.get("example", location.directory / "data" / "example.jsonl"),
        train_path=paths.get("train"),
    )


def dataset_paths(
    location: EnvironmentLocation, agent_configs: Iterable[Mapping[str, Any]]
) -> dict[str, Path]:
    """Dataset type (``example``, ``train`` ...) -> the first such dataset's file.

    ``agent_configs`` are the inner blocks of the environment's agents, in config order;
    each ``jsonl_fpath`` is resolved against the environment's root
    (:attr:`~nemogym_sdk.gym.locate.EnvironmentLocation.root`).
    """
    paths: dict[str, Path] = {}
    for inner in agent_configs:
        for dataset in inner.get("datasets") or []:
            if isinstance(dataset, Mapping) and dataset.get("jsonl_fpath"):
                kind = str(dataset.get("type"))
                paths.setdefault(kind, location.resolve(str(dataset["jsonl_fpath"])))
    return paths


def _reject_directives(node: Any, where: str) -> None:
    """Refuse NeMo Gym's inheritance directives, which only its own parser resolves."""
    if isinstance(node, Mapping):
        for key, value in node.items():
            if key in _UNSUPPORTED_KEYS:
                raise ConfigError(f"{where}: directive {key!r} is not supported")
            _reject_directives(value, where)
    elif isinstance(node, list):
        for value in node:
            _reject_directives(value, where)
    elif isinstance(node, str) and node.startswith(_UNSUPPORTED_INTERPOLATIONS):
        raise ConfigError(f"{where}: interpolation {node!r} is not supported")


def _deep_merge(base: Mapping[str, Any], update: Mapping[str, Any]) -> dict[str, Any]:
    merged = {key: copy.deepcopy(value) for key, value in base.items()}
    for key, value in update.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = _deep_merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged
