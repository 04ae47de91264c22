"""check_served_name: NeMo Gym's model servers must request the LoRA adapter by its name.

The unit cases read directories built on config mappings; the ``gym`` cases start one real
stack (with the head server) and check it both from ``GymStack.directory`` and from
``ServerDirectory.from_head``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import attrs
import pytest

from nemogym_sdk import ServerDirectory
from nemogym_sdk.errors import ConfigError
from nemogym_sdk.gym import GymStack, PolicyModel
from nemogym_sdk.lora import check_served_name

from .stacks import StackFactory

ENVIRONMENT = "example_single_tool_call"


def vllm_model(base_url: Any, model: str) -> dict[str, Any]:
    return {"responses_api_models": {"vllm_model": {"base_url": base_url, "model": model}}}


def config(**servers: Any) -> ServerDirectory:
    """A directory whose global config has the usual top-level policy keys plus the given
    server blocks."""
    return ServerDirectory(
        [],
        config={
            "policy_base_url": "http://127.0.0.1:8000/v1",
            "policy_model_name": "policy",
            "head_server": {"host": "127.0.0.1", "port": 11000},
            "agent": {"responses_api_agents": {"simple_agent": {"model_server": {"name": "m"}}}},
            **servers,
        },
    )


# --- unit cases on directories' configs -------------------------------------------------------


def test_interpolated_names_and_urls_are_resolved() -> None:
    """``${policy_model_name}`` and ``${policy_base_url}`` resolve against the config."""
    cfg = config(policy_model=vllm_model("${policy_base_url}", "${policy_model_name}"))
    check_served_name(cfg, "policy")
    check_served_name(cfg, "policy", backend_url="http://localhost:8000")
    with pytest.raises(ConfigError) as info:
        check_served_name(cfg, "other")
    message = str(info.value)
    assert "'policy_model' (vllm_model) requests model 'policy'" in message
    assert "served as 'other'" in message
    assert "PolicyModel(model='other')" in message and "policy_model_name=other" in message


def test_an_unresolvable_name_is_reported_as_written() -> None:
    """A reference to a missing key stays as text, and the error shows it."""
    cfg = config(policy_model=vllm_model("${policy_base_url}", "${missing_name}"))
    with pytest.raises(ConfigError, match=r"requests model '\$\{missing_name\}'"):
        check_served_name(cfg, "policy")


def test_list_base_urls_and_equivalent_loopback_hosts() -> None:
    """NeMo Gym's vllm_model spreads rollouts over every URL of a base_url list, so the
    adapter must be published to each (replicas: a list of backend URLs); 0.0.0.0 =
    localhost = 127.0.0.1. A model server that also sends to a URL the adapter does not
    reach is an error naming that URL."""
    urls = ["http://10.0.0.5:8000/v1", "http://0.0.0.0:8001/v1"]
    cfg = config(policy_model=vllm_model(urls, "policy"))
    check_served_name(cfg, "policy", backend_url=["http://localhost:8001/v1", "10.0.0.5:8000"])
    with pytest.raises(ConfigError, match=r"also sends requests to http://10\.0\.0\.5:8000/v1"):
        check_served_name(cfg, "policy", backend_url="http://localhost:8001/v1")
    with pytest.raises(ConfigError, match="no NeMo Gym model server sends requests to"):
        check_served_name(cfg, "policy", backend_url="http://127.0.0.1:8002")


def test_only_model_servers_of_the_backend_count() -> None:
    """A judge model on another backend may request another name; the policy's may not."""
    cfg = config(
        policy_model=vllm_model("http://127.0.0.1:8000/v1", "policy"),
        judge_model=vllm_model("http://127.0.0.1:9000/v1", "Qwen/Qwen3-8B"),
    )
    check_served_name(cfg, "policy", backend_url="http://127.0.0.1:8000/v1")
    with pytest.raises(ConfigError, match="'judge_model' \\(vllm_model\\) requests model 'Qwen"):
        check_served_name(cfg, "policy")  # without backend_url every model server counts
    with pytest.raises(ConfigError) as info:
        check_served_name(cfg, "policy", backend_url="http://127.0.0.1:9000")
    assert "Qwen/Qwen3-8B" in str(info.value) and "'policy'" in str(info.value)


def test_no_model_server_is_an_error() -> None:
    """A config without any model server cannot serve the adapter."""
    with pytest.raises(ConfigError, match="no model server"):
        check_served_name(config(), "policy")
    with pytest.raises(ConfigError, match=r"\(none\)"):
        check_served_name(config(), "policy", backend_url="http://127.0.0.1:8000")


def test_openai_model_servers_are_checked_too() -> None:
    """``openai_model`` names its model ``openai_model`` and its URL ``openai_base_url``."""
    block = {"openai_model": {"openai_base_url": "http://127.0.0.1:8000/v1", "openai_model": "x"}}
    cfg = config(policy_model={"responses_api_models": block})
    with pytest.raises(ConfigError, match="'policy_model' \\(openai_model\\) requests model 'x'"):
        check_served_name(cfg, "policy", backend_url="http://127.0.0.1:8000")


def test_deployment_kinds() -> None:
    """A ServerDirectory without a config, or anything but a directory, is a ConfigError."""
    with pytest.raises(ConfigError, match="from_head"):
        check_served_name(ServerDirectory.from_urls(agents={"a": "127.0.0.1:1"}), "policy")
    with pytest.raises(ConfigError, match="takes a ServerDirectory"):
        check_served_name(object(), "policy")  # type: ignore[arg-type]
    check_served_name(config(m=vllm_model("http://h:1/v1", "policy")), "policy")


# --- one real stack -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def stack(stack_factory: StackFactory) -> Iterator[GymStack]:
    """example_single_tool_call plus the head server; the model server requests "policy"."""
    model = attrs.evolve(stack_factory.model, model="policy")
    with stack_factory([ENVIRONMENT], model=model, head_server=True) as started:
        yield started


@pytest.mark.gym
def test_a_real_stack_requests_the_adapter_by_name(stack: GymStack, backend: PolicyModel) -> None:
    """From the GymStack and from its head server: "policy" passes, "other" is named wrong."""
    assert stack.directory.head_url is not None
    directory = ServerDirectory.from_head(stack.directory.head_url)
    check_served_name(stack.directory, "policy")
    check_served_name(directory, "policy", backend_url=backend.base_url)
    for deployment in (stack.directory, directory):
        with pytest.raises(ConfigError) as info:
            check_served_name(deployment, "other", backend_url=backend.base_url)
        message = str(info.value)
        assert "model server 'policy_model' (vllm_model) requests model 'policy'" in message
        assert "served as 'other'" in message
    with pytest.raises(ConfigError, match="no NeMo Gym model server sends requests to"):
        check_served_name(directory, "policy", backend_url="http://127.0.0.1:1/v1")
