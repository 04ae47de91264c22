"""Records describing a NeMo Gym stack: the policy model, its servers and its config."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs
import yaml

from nemogym_sdk.errors import ConfigError
from nemogym_sdk.processes.ports import LOOPBACK
from nemogym_sdk.wire import AGENTS, ENVIRONMENT_SERVERS, MODELS, RESOURCES

__all__ = [
    "AGENTS",
    "ENVIRONMENT_SERVERS",
    "LOOPBACK",
    "MODELS",
    "RESOURCES",
    "EnvironmentSetup",
    "PolicyModel",
    "ServerSpec",
    "StackConfig",
]


@attrs.frozen(kw_only=True)
class PolicyModel:
    """The OpenAI-compatible backend the agents sample from, as a ``vllm_model`` server.

    The fields map one to one onto NeMo Gym's ``vllm_model`` config
    (``responses_api_models/vllm_model/configs/vllm_model_for_training.yaml``).
    """

    base_url: str
    """Backend base URL including ``/v1``, e.g. ``http://127.0.0.1:8000/v1``."""
    model: str
    """Model name sent in every request (the served model or LoRA adapter name)."""
    api_key: str = "dummy"
    """Bearer token for the backend."""
    instance_name: str = "policy_model"
    """Top-level config key; the shipped agents refer to ``policy_model``."""
    return_token_id_information: bool = True
    """Attach ``prompt_token_ids``/``generation_token_ids``/``generation_log_probs`` (training)."""
    request_prompt_and_generation_token_ids: bool = False
    """Ask the backend for inline token ids (``return_token_ids``) instead of ``/tokenize``."""
    uses_reasoning_parser: bool = True
    """Split ``reasoning_content``/``<think>`` into reasoning items (the training config's default).

    With ``False`` NeMo Gym asserts that the backend never returns reasoning."""
    extra: Mapping[str, Any] = attrs.field(factory=dict)
    """Any other ``vllm_model`` keys (``chat_template_kwargs``, ``extra_body`` ...), merged last."""

    def server_block(self) -> dict[str, Any]:
        """The ``vllm_model`` block (without host and port) for this backend."""
        block: dict[str, Any] = {
            "entrypoint": "app.py",
            "base_url": self.base_url,
            "api_key": self.api_key,
            "model": self.model,
            "return_token_id_information": self.return_token_id_information,
            "request_prompt_and_generation_token_ids": self.request_prompt_and_generation_token_ids,
            "uses_reasoning_parser": self.uses_reasoning_parser,
        }
        block.update(copy.deepcopy(dict(self.extra)))
        return block


@attrs.frozen(kw_only=True)
class ServerSpec:
    """One server process of the stack."""

    instance: str
    """Top-level config key, unique in the stack (``NEMO_GYM_CONFIG_PATH``)."""
    server_type: str
    """``responses_api_models``, ``resources_servers`` or ``responses_api_agents``."""
    impl: str
    """Implementation directory, e.g. ``simple_agent`` or ``example_single_tool_call``."""
    entrypoint: str
    """Script inside the implementation directory, normally ``app.py``."""
    host: str
    """Address it binds to."""
    port: int
    """Port it binds to."""
    environment: str | None
    """The environment whose config defined it; ``None`` for the policy model."""

    @property
    def url(self) -> str:
        """``http://host:port`` of the server."""
        return f"http://{self.host}:{self.port}"


@attrs.frozen(kw_only=True)
class EnvironmentSetup:
    """What one environment contributed to the stack."""

    name: str
    """Environment name (its resources server directory)."""
    config_path: Path
    """The shipped YAML it was built from."""
    agents: tuple[str, ...]
    """Agent instance names, in config order (the first is the default agent)."""
    agent_impls: tuple[str, ...]
    """Agent implementation of each agent (``simple_agent``, ``gymnasium_agent`` ...)."""
    resources_servers: tuple[str, ...]
    """Resources server instance names."""
    dropped: tuple[str, ...]
    """Instances of the shipped config that are not started (environment servers)."""
    example_path: Path
    """The shipped example rows (the config's ``example`` dataset, else ``data/example.jsonl``)."""
    train_path: Path | None = None
    """The config's ``train`` dataset, resolved; ``None`` when it lists none."""
    allowed_agents: tuple[str, ...] = ()
    """Agent implementations its resources servers accept (``allowed_agents``), in order."""

    @property
    def agent(self) -> str | None:
        """The agent instance its rows go to: the first of :attr:`agents` (None: it has none)."""
        return self.agents[0] if self.agents else None


@attrs.frozen(kw_only=True)
class StackConfig:
    """The resolved global config of a stack and the servers to start from it."""

    global_config: Mapping[str, Any]
    """The NeMo Gym global config dict (what ``/global_config_dict_yaml`` serves)."""
    servers: tuple[ServerSpec, ...]
    """Servers to start, models first, then resources servers, then agents."""
    environments: tuple[EnvironmentSetup, ...]
    """Per environment, in the order requested."""
    head_host: str
    """``head_server.host`` of the config."""
    head_port: int
    """``head_server.port`` of the config (only listened on in head-server mode)."""

    def to_yaml(self) -> str:
        """The global config as the YAML text handed to every server."""
        return yaml.safe_dump(_plain(self.global_config), sort_keys=False)

    def server(self, instance: str) -> ServerSpec:
        """The server with this instance name; ``ConfigError`` if there is none."""
        for spec in self.servers:
            if spec.instance == instance:
                return spec
        raise ConfigError(f"no server named {instance!r} in the stack")

    def environment(self, name: str) -> EnvironmentSetup:
        """The environment of this name; ``ConfigError`` naming the stack's if there is none."""
        for setup in self.environments:
            if setup.name == name:
                return setup
        known = ", ".join(e.name for e in self.environments)
        raise ConfigError(f"{name!r} is not an environment of this stack ({known})")


def _plain(node: Any) -> Any:
    """Mappings and sequences as plain dicts and lists, so ``yaml.safe_dump`` accepts them."""
    if isinstance(node, Mapping):
        return {str(key): _plain(value) for key, value in node.items()}
    if isinstance(node, (list, tuple)):
        return [_plain(value) for value in node]
    if isinstance(node, Path):
        return str(node)
    if node is None or isinstance(node, (str, int, float, bool)):
        return node
    raise ConfigError(f"config value {node!r} of type {type(node).__name__} is not YAML data")
