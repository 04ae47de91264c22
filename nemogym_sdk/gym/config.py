"""Build the resolved NeMo Gym global config for a set of shipped environments.

NeMo Gym servers read one global config (YAML in ``NEMO_GYM_CONFIG_DICT``) and find
their own block under the top-level key named by ``NEMO_GYM_CONFIG_PATH``. A block is
``<instance>: {<server_type>: {<impl>: {entrypoint, host, port, ...}}}`` and servers
refer to each other with ``{type: <server_type>, name: <instance>}``.

What :func:`build_stack_config` does with an environment's shipped
``configs/<env>.yaml`` (in ``resources_servers/<env>`` of the NeMo Gym venv, or in
``nemogym_sdk/gym/envs/<env>`` for environments shipped with the SDK; see
:func:`~nemogym_sdk.gym.locate.locate_environment`):

* keeps its resources server and agent instances verbatim;
* drops its ``environment_servers`` instances: in 0.7.0 they only front the agent for
  ``gym eval run`` (posting to the agent's ``/run`` gives the same result), and the
  ``legacy_agent`` relay does not declare ``ray_enabled``, so started on its own it
  would start a Ray cluster of its own;
* adds one ``vllm_model`` instance (``policy_model`` by default, the name the shipped
  agents refer to) configured for training from a :class:`PolicyModel`, in place of a
  model server of that name the environment defines as a default;
* starts every other model server the environment needs (judges, user simulators,
  reward models: see :func:`wire_model_dependencies`) as a ``vllm_model`` on the judge
  endpoint (:func:`judge_server_block`), replacing the ones it declares;
* keeps the environment's top-level variables (``judge_base_url: null`` ...) as globals;
* fills the global keys a server reads at start-up (``head_server``, ``dry_run``, the
  ``policy_*`` and ``judge_*`` keys the shipped model configs interpolate,
  ``results_dir``/``cache_dir``);
* deep-merges caller ``overrides``, then pins every server without a host/port to
  127.0.0.1 and a free port, then checks that every server reference points at an
  instance of the right type.

Everything here is pure (no processes); ports come from an injectable allocator.
"""

from __future__ import annotations

import copy
import random
import socket
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from nemogym_sdk.errors import ConfigError
from nemogym_sdk.gym.directives import deep_merge, is_copy
from nemogym_sdk.gym.loading import (
    SERVER_TYPES,
    environment_config_path,
    load_environment_config,
    server_type_of,
)
from nemogym_sdk.gym.locate import EnvironmentLocation, GymVenv, locate_environment
from nemogym_sdk.gym.specs import (
    AGENTS,
    LOOPBACK,
    MODELS,
    RESOURCES,
    EnvironmentSetup,
    PolicyModel,
    ServerSpec,
    StackConfig,
)

_KEPT_TYPES = (MODELS, RESOURCES, AGENTS)
# Start order: what others call first, so a caller never waits on a callee.
_START_ORDER = {MODELS: 0, RESOURCES: 1, AGENTS: 2}

__all__ = [
    "JUDGE_INSTANCE",
    "PORT_RANGE",
    "WIRABLE_MODEL_IMPLS",
    "build_stack_config",
    "judge_server_block",
    "dataset_paths",
    "environment_config_path",
    "free_loopback_ports",
    "load_environment_config",
    "wire_model_dependencies",
]


JUDGE_INSTANCE = "judge_model"
"""Model server the stack adds, with an explicit ``judge``, for environments whose judge is
``policy_model`` (``equivalence_llm_judge``, ``multichallenge`` ...); the name NeMo Gym's
own configs give a separate judge."""

WIRABLE_MODEL_IMPLS: frozenset[str] = frozenset(
    {
        "azure_openai_model",
        "inference_provider",
        "litellm_model",
        "local_vllm_model",
        "openai_model",
        "vllm_model",
    }
)
"""Model server implementations an environment may declare that the stack replaces with a
``vllm_model`` on the judge endpoint: each only forwards to some OpenAI-compatible model.
Others (``genrm_model``'s pairwise roles, ``switchyard_model``'s router,
``vllm_model_with_compaction`` ...) speak more than that and are refused."""

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


def build_stack_config(
    venv: GymVenv,
    environments: Sequence[str],
    model: PolicyModel,
    *,
    judge: PolicyModel | None = None,
    workdir: Path | None = None,
    default_max_steps: int | None = None,
    overrides: Mapping[str, Any] | None = None,
    allocate_ports: Callable[[int], Sequence[int]] = free_loopback_ports,
) -> StackConfig:
    """Resolve the global config that runs ``environments`` against ``model``.

    ``judge`` is the OpenAI-compatible endpoint every other model server the environments
    need is pointed at (see :func:`wire_model_dependencies`); ``None`` means the policy's
    own backend. ``default_max_steps`` is written into agents whose config has no
    ``max_steps`` (``simple_agent`` is unbounded by default). ``overrides`` is deep-merged
    into the result last (e.g. ``{"blackjack_gymnasium_agent": {"responses_api_agents":
    {"gymnasium_agent": {"max_steps": 2}}}}``). ``workdir`` receives NeMo Gym's
    ``results_dir`` and ``cache_dir``. ``allocate_ports(n)`` returns ``n`` ports, one
    for each server (and the head server) whose port ``overrides`` did not pin.
    Overrides may also add server instances, which are started with the rest.
    """
    if not environments:
        raise ConfigError("at least one environment is required")
    if len(set(environments)) != len(environments):
        raise ConfigError(f"environments listed twice: {list(environments)}")

    config: dict[str, Any] = {}
    owner: dict[str, str | None] = {}
    variables: dict[str, tuple[str, Any]] = {}
    declared_models: dict[str, str] = {}
    partial: list[tuple[EnvironmentLocation, list[str]]] = []
    for environment in environments:
        location = locate_environment(venv, environment)
        shipped = load_environment_config(venv, environment)
        dropped: list[str] = []
        for instance, block in shipped.items():
            server_type = server_type_of(block)
            if server_type is None and is_copy(block):
                source = block["_copy"]
                if source != model.instance_name and server_type_of(shipped.get(source)) != MODELS:
                    raise ConfigError(
                        f"{environment}: {instance!r} copies {source!r} (_copy), which is not "
                        "a model server; only copies of model servers are supported"
                    )
                declared_models[instance] = f"copy of {source}"
                continue
            if server_type is None:
                _add_variable(variables, environment, instance, block)
                continue
            if server_type not in _KEPT_TYPES:
                dropped.append(instance)
                continue
            if server_type == MODELS and instance == model.instance_name:
                continue  # a default policy (nemo_user_sim's): the stack's policy replaces it
            if server_type == MODELS:
                # Replaced by the judge block below; shared by every environment naming it.
                declared_models[instance] = _declared_model(environment, instance, block)
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
            f"{owner[model.instance_name]!r} already defines {model.instance_name!r} as a "
            "server that is not a model server; give the PolicyModel another instance_name"
        )
    judge_block = judge_server_block(judge if judge is not None else model)
    for instance in wire_model_dependencies(
        config, model.instance_name, declared_models, rename_policy=judge is not None
    ):
        config[instance] = {MODELS: {"vllm_model": copy.deepcopy(judge_block)}}
        owner[instance] = None
    config[model.instance_name] = {MODELS: {"vllm_model": model.server_block()}}
    owner[model.instance_name] = None

    if default_max_steps is not None:
        if default_max_steps < 1:
            raise ConfigError(f"default_max_steps must be >= 1, got {default_max_steps}")
        for instance, block in config.items():
            server_type, _, inner = _inner(instance, block)
            if server_type == AGENTS and inner.get("max_steps") is None:
                inner["max_steps"] = default_max_steps

    effective_judge = judge if judge is not None else model
    globals_: dict[str, Any] = {name: value for name, (_, value) in variables.items()}
    globals_.update(
        {
            "head_server": {"host": LOOPBACK},
            "dry_run": False,
            "policy_base_url": model.base_url,
            "policy_api_key": model.api_key,
            "policy_model_name": model.model,
            # What the shipped judge blocks interpolate (${judge_base_url} ...).
            "judge_base_url": effective_judge.base_url,
            "judge_api_key": effective_judge.api_key,
            "judge_model_name": effective_judge.model,
        }
    )
    if workdir is not None:
        globals_["results_dir"] = str(workdir / "results")
        globals_["cache_dir"] = str(workdir / "cache")
    config = deep_merge({**globals_, **config}, overrides or {})
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


def judge_server_block(judge: PolicyModel) -> dict[str, Any]:
    """The ``vllm_model`` block (without host and port) of a judge on ``judge``'s endpoint.

    ``base_url``, ``api_key``, ``model``, ``uses_reasoning_parser`` and ``extra`` come from
    ``judge``; token-id information is always off (nothing trains on a judge's tokens, and
    it would cost a ``/tokenize`` call per verdict, which OpenAI's own API lacks).
    ``vllm_model`` serves both APIs judges call (``/v1/responses``, translated to chat
    completions, and ``/v1/chat/completions``) and needs only chat completions upstream.
    """
    plain = attrs.evolve(
        judge, return_token_id_information=False, request_prompt_and_generation_token_ids=False
    )
    return plain.server_block()


def wire_model_dependencies(
    config: dict[str, Any],
    policy_instance: str,
    declared_models: Mapping[str, str],
    *,
    rename_policy: bool,
) -> list[str]:
    """Rewire the model servers the kept servers call besides the policy; return their names.

    A *model dependency* is any ``{type: responses_api_models, name: ...}`` reference in a
    resources server's block (``judge_model_server``, ``user_model_server``,
    ``genrm_model_server``, ``retrieval_model_server`` ...) or in an agent's block other
    than its own ``model_server``, plus every model instance an environment declares
    (``declared_models``: instance -> implementation, e.g. ``judge_model: openai_model``).
    Each such instance is returned, to be started as a ``vllm_model`` on the judge
    endpoint: a declared block is replaced (its ``${judge_base_url}``-style settings with
    it), an undeclared name (``simpleqa``'s ``genrm_model``) is added. References to the
    policy instance are judges that share the policy: with ``rename_policy`` (an explicit
    judge) they are rewritten, in ``config``, to :data:`JUDGE_INSTANCE`; otherwise they
    stay on the policy's own server. An agent sampling from a declared model server is
    refused: the stack serves agents only the policy.
    """
    needed = dict.fromkeys(declared_models)
    for instance, block in config.items():
        server_type, _, inner = _inner(instance, block)
        if server_type == AGENTS:
            ref: Any = inner.get("model_server")
            name = str(ref["name"]) if _is_model_ref(ref) else ""
            if name in declared_models:
                raise ConfigError(
                    f"agent {instance!r} samples from {name!r} (model_server), a "
                    f"{declared_models[name]} server its environment declares; the "
                    "stack serves agents only the policy: point model_server at "
                    f"{policy_instance!r} in overrides"
                )
        for holder, key in _dependency_refs(inner, top=server_type == AGENTS):
            name = str(holder[key]["name"])
            if name == policy_instance:
                if not rename_policy:
                    continue
                holder[key] = {"type": MODELS, "name": JUDGE_INSTANCE}
                name = JUDGE_INSTANCE
            needed.setdefault(name)
    return list(needed)


def _dependency_refs(node: Any, *, top: bool) -> Iterable[tuple[Any, Any]]:
    """``(container, key or index)`` of each model reference below ``node``.

    With ``top`` (an agent's block) its own ``model_server`` is the policy and is skipped.
    """
    if isinstance(node, dict):
        items: Iterable[tuple[Any, Any]] = list(node.items())
    elif isinstance(node, list):
        items = list(enumerate(node))
    else:
        return
    for key, value in items:
        if _is_model_ref(value):
            if not (top and key == "model_server"):
                yield node, key
        else:
            yield from _dependency_refs(value, top=False)


def _is_model_ref(node: Any) -> bool:
    return isinstance(node, Mapping) and set(node) == {"type", "name"} and node["type"] == MODELS


def _declared_model(environment: str, instance: str, block: Mapping[str, Any]) -> str:
    """The implementation of a model server an environment declares, if the stack can wire it."""
    ((impl, _),) = block[MODELS].items()
    if impl not in WIRABLE_MODEL_IMPLS:
        raise ConfigError(
            f"{environment}: model server {instance!r} is a {impl} server, which the stack "
            "cannot point at an OpenAI-compatible judge endpoint (it can replace "
            f"{', '.join(sorted(WIRABLE_MODEL_IMPLS))}); start it yourself and give it to "
            f"the stack with overrides={{{instance!r}: ...}}"
        )
    return str(impl)


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


def _pin_addresses(config: dict[str, Any], allocate_ports: Callable[[int], Sequence[int]]) -> None:
    """Give the head server and every server without a host/port a loopback address."""
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
    config: Mapping[str, Any], owner: Mapping[str, str | None]
) -> tuple[ServerSpec, ...]:
    specs = []
    for instance, block in config.items():
        if server_type_of(block) is None:
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
        if set(node) == {"type", "name"} and node["type"] in SERVER_TYPES:
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
