"""Head-server mode: NeMo Gym's own HeadServer lists the started servers and the config."""

from __future__ import annotations

import json
from collections.abc import Iterator

import attrs
import pytest
import requests
import yaml

from nemogym_sdk import AgentClient, ConfigError, RolloutStatus, ServerDirectory, load_rows
from nemogym_sdk.gym import HEAD_SERVER_NAME, GymStack

from .stacks import StackFactory, agent_url, head_url

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
    listed = requests.get(f"{head_url(head_stack)}/server_instances", timeout=10).json()
    by_name = {item["process_name"]: item for item in listed}
    assert set(by_name) == {spec.instance for spec in head_stack.config.servers}
    for spec in head_stack.config.servers:
        item = by_name[spec.instance]
        assert (item["host"], item["port"], item["url"]) == (spec.host, spec.port, spec.url)
        assert (item["server_type"], item["name"]) == (spec.server_type, spec.impl)
        assert item["pid"] == head_stack.pids[spec.instance]
        assert item["config_path"] == spec.instance
    agent = by_name[f"{ENVIRONMENT}_simple_agent"]
    assert agent["url"] == agent_url(head_stack, ENVIRONMENT)


def test_global_config_dict_yaml_is_yaml_inside_a_json_string(head_stack: GymStack) -> None:
    """GET /global_config_dict_yaml: a JSON string whose YAML is the config the servers got."""
    raw = requests.get(f"{head_url(head_stack)}/global_config_dict_yaml", timeout=10)
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
    assert requests.get(f"{head_url(head_stack)}/readyz", timeout=10).json() == {"status": "ok"}
    assert HEAD_SERVER_NAME in head_stack.pids
    assert (
        "head server ready: 3 server instances"
        in head_stack.log_paths[HEAD_SERVER_NAME].read_text()
    )


def test_run_through_a_discovered_agent(head_stack: GymStack) -> None:
    """An agent found via /server_instances serves /run with inline token ids."""
    listed = requests.get(f"{head_url(head_stack)}/server_instances", timeout=10).json()
    (agent,) = [item for item in listed if item["server_type"] == "responses_api_agents"]
    row = head_stack.example_rows(ENVIRONMENT)[0]
    result = requests.post(f"{agent['url']}/run", json=row, timeout=120).json()
    assert isinstance(result["reward"], float)
    assert any(item.get("generation_token_ids") for item in result["response"]["output"])


def _same_deployment(local: ServerDirectory, remote: ServerDirectory) -> None:
    assert local.agents == remote.agents
    assert local.resources_servers == remote.resources_servers
    assert local.models == remote.models
    for mine, theirs in zip(local.servers(), remote.servers(), strict=True):
        assert (mine.name, mine.server_type, mine.implementation, mine.url) == (
            theirs.name,
            theirs.server_type,
            theirs.implementation,
            theirs.url,
        )
        assert mine.config == theirs.config
    for agent in local.agents:
        assert local.resources_server_of(agent) == remote.resources_server_of(agent)


def test_stack_directory_is_what_discovery_returns(head_stack: GymStack) -> None:
    """``GymStack.directory`` describes the deployment exactly as ``ServerDirectory``
    discovers it from NeMo Gym's head server: same servers, URLs, kinds and configs."""
    local = head_stack.directory
    remote = ServerDirectory.from_head(head_url(head_stack), wait=30)
    _same_deployment(local, remote)
    assert local.head_url == remote.head_url
    assert local.agent_url(f"{ENVIRONMENT}_simple_agent") == agent_url(head_stack, ENVIRONMENT)
    assert local.default_agent == remote.default_agent == f"{ENVIRONMENT}_simple_agent"


def test_stack_task_rows_have_load_rows_ids(head_stack: GymStack) -> None:
    """``task_rows`` reads the example rows through ``nemogym_sdk.data``: the ids are those
    ``load_rows`` gives for the same file, and the data is what ``example_rows`` parses."""
    rows = head_stack.task_rows(ENVIRONMENT)
    path = head_stack.example_paths[ENVIRONMENT]
    assert [r.row_id for r in rows] == [r.row_id for r in load_rows(path)]
    assert [dict(r.data) for r in rows] == head_stack.example_rows(ENVIRONMENT)
    assert rows and all(r.row_id.startswith(f"{path}:") for r in rows)
    with pytest.raises(ConfigError, match="not an environment"):
        head_stack.task_rows("nope")


def test_manual_stack_directory_plays_rows(stack_factory: StackFactory) -> None:
    """Without a head server, ``directory`` is still the deployment: an AgentClient built
    on it plays the stack's task rows to OK rollouts."""
    model = attrs.evolve(stack_factory.model, request_prompt_and_generation_token_ids=True)
    with stack_factory([ENVIRONMENT], model=model) as stack:
        directory = stack.directory
        assert directory.head_url is None
        assert set(directory.agents) == set(stack.environment(ENVIRONMENT).agents)
        assert set(directory.resources_servers) == set(
            stack.environment(ENVIRONMENT).resources_servers
        )
        with AgentClient(directory) as client:
            (rollout,) = client.run_sync(stack.task_rows(ENVIRONMENT)[:1], eos_token_id=0)
    assert rollout.status is RolloutStatus.OK, rollout.error
    assert rollout.row_id == f"{stack.example_paths[ENVIRONMENT]}:1"
