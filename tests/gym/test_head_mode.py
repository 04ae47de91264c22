"""Head-server mode: NeMo Gym's own HeadServer lists the started servers and the config."""

from __future__ import annotations

import json
from collections.abc import Iterator

import attrs
import pytest
import requests
import yaml

from nemogym_sdk.gym import HEAD_SERVER_NAME, GymStack

from .stacks import StackFactory

pytestmark = pytest.mark.gym

ENVIRONMENT = "example_single_tool_call"


@pytest.fixture(scope="module")
def head_stack(stack_factory: StackFactory) -> Iterator[GymStack]:
    """One environment plus the head server; the model asks for inline token ids."""
    model = attrs.evolve(stack_factory.model, request_prompt_and_generation_token_ids=True)
    with stack_factory([ENVIRONMENT], model=model, head_server=True) as stack:
        yield stack


def test_server_instances_lists_the_started_servers(head_stack: GymStack) -> None:
    """GET /server_instances: one entry per server with its real host, port, url and pid."""
    assert head_stack.head_url is not None
    listed = requests.get(f"{head_stack.head_url}/server_instances", timeout=10).json()
    by_name = {item["process_name"]: item for item in listed}
    assert set(by_name) == {spec.instance for spec in head_stack.config.servers}
    for spec in head_stack.config.servers:
        item = by_name[spec.instance]
        assert (item["host"], item["port"], item["url"]) == (spec.host, spec.port, spec.url)
        assert (item["server_type"], item["name"]) == (spec.server_type, spec.impl)
        assert item["pid"] == head_stack.pids[spec.instance]
        assert item["config_path"] == spec.instance
    agent = by_name[f"{ENVIRONMENT}_simple_agent"]
    assert agent["url"] == head_stack.agent_url(ENVIRONMENT)


def test_global_config_dict_yaml_is_yaml_inside_a_json_string(head_stack: GymStack) -> None:
    """GET /global_config_dict_yaml: a JSON string whose YAML is the config the servers got."""
    assert head_stack.head_url is not None
    raw = requests.get(f"{head_stack.head_url}/global_config_dict_yaml", timeout=10)
    text = json.loads(raw.content)
    assert isinstance(text, str)
    config = yaml.safe_load(text)
    assert config == yaml.safe_load(head_stack.config_path.read_text())
    assert config["head_server"] == {"host": "127.0.0.1", "port": head_stack.config.head_port}
    model = config["policy_model"]["responses_api_models"]["vllm_model"]
    assert model["return_token_id_information"] is True
    assert model["request_prompt_and_generation_token_ids"] is True


def test_head_is_ready_and_logged(head_stack: GymStack) -> None:
    """The head answers /readyz 200 only once all servers are up, and has its own log."""
    assert head_stack.head_url is not None
    assert requests.get(f"{head_stack.head_url}/readyz", timeout=10).json() == {"status": "ok"}
    assert HEAD_SERVER_NAME in head_stack.pids
    assert (
        "head server ready: 3 server instances"
        in head_stack.log_paths[HEAD_SERVER_NAME].read_text()
    )


def test_run_through_a_discovered_agent(head_stack: GymStack) -> None:
    """An agent found via /server_instances serves /run with inline token ids."""
    assert head_stack.head_url is not None
    listed = requests.get(f"{head_stack.head_url}/server_instances", timeout=10).json()
    (agent,) = [item for item in listed if item["server_type"] == "responses_api_agents"]
    row = head_stack.example_rows(ENVIRONMENT)[0]
    result = requests.post(f"{agent['url']}/run", json=row, timeout=120).json()
    assert isinstance(result["reward"], float)
    assert any(item.get("generation_token_ids") for item in result["response"]["output"])
