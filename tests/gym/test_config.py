"""Building the resolved NeMo Gym config from shipped environment YAMLs (no processes)."""

from __future__ import annotations

import copy
import socket
from pathlib import Path

import pytest
import yaml

from nemogym_sdk.errors import ConfigError
from nemogym_sdk.gym import (
    CATALOGUE,
    GymVenv,
    PolicyModel,
    build_stack_config,
    free_loopback_ports,
)
from nemogym_sdk.gym.loading import load_environment_config, server_type_of
from nemogym_sdk.gym.resolve import resolve_each

from .fakes import TOY_CONFIG, counting_ports, make_venv

MODEL = PolicyModel(base_url="http://127.0.0.1:8000/v1", model="tiny")


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> GymVenv:
    """One miniature venv for the tests that only read it: the toy, ``capped`` (an agent
    with ``max_steps`` and no environment server) and ``twin`` (the toy's instances again),
    resolved together in one request to the NeMo Gym worker (then cached)."""
    capped = copy.deepcopy(TOY_CONFIG)
    del capped["toy_environment_server"]
    capped["toy_simple_agent"]["responses_api_agents"]["simple_agent"]["max_steps"] = 3
    environments = {"toy": TOY_CONFIG, "capped": _renamed(capped, "capped"), "twin": TOY_CONFIG}
    venv = make_venv(tmp_path_factory.mktemp("shared") / "venv", environments)
    resolve_each(venv, list(environments))
    return venv


def test_toy_config_keeps_agent_and_resources_drops_environment_server(
    shared: GymVenv, tmp_path: Path
) -> None:
    """Resources server and agent are kept verbatim, the environment server is dropped."""
    venv = shared
    stack = build_stack_config(venv, ["toy"], MODEL, allocate_ports=counting_ports(20000))
    config = stack.global_config
    assert "toy_environment_server" not in config
    assert config["toy"]["resources_servers"]["toy"]["description"] == "a toy"
    agent = config["toy_simple_agent"]["responses_api_agents"]["simple_agent"]
    assert agent["model_server"] == {"type": "responses_api_models", "name": "policy_model"}
    (setup,) = stack.environments
    assert setup.agents == ("toy_simple_agent",)
    assert setup.agent_impls == ("simple_agent",)
    assert setup.resources_servers == ("toy",)
    assert setup.dropped == ("toy_environment_server",)
    assert setup.example_path == venv.site_packages / "resources_servers/toy/data/example.jsonl"


def test_servers_pinned_to_loopback_distinct_ports_models_first(
    shared: GymVenv, tmp_path: Path
) -> None:
    """Every server gets 127.0.0.1 and its own port; start order is model, resources, agent."""
    venv = shared
    stack = build_stack_config(venv, ["toy"], MODEL, allocate_ports=counting_ports(20000))
    assert [s.instance for s in stack.servers] == ["policy_model", "toy", "toy_simple_agent"]
    assert [s.server_type for s in stack.servers] == [
        "responses_api_models",
        "resources_servers",
        "responses_api_agents",
    ]
    ports = [s.port for s in stack.servers] + [stack.head_port]
    assert len(set(ports)) == len(ports) == 4
    assert all(s.host == "127.0.0.1" for s in stack.servers)
    assert stack.head_host == "127.0.0.1"
    assert stack.server("toy").url == f"http://127.0.0.1:{stack.server('toy').port}"
    block = stack.global_config["toy"]["resources_servers"]["toy"]
    assert (block["host"], block["port"]) == ("127.0.0.1", stack.server("toy").port)
    assert sorted(stack.global_config["disallowed_ports"]) == sorted(ports)


def test_policy_model_block_is_the_training_vllm_model(shared: GymVenv, tmp_path: Path) -> None:
    """The vllm_model instance carries the backend and the training switches."""
    venv = shared
    model = PolicyModel(
        base_url="http://127.0.0.1:9/v1",
        model="m",
        api_key="k",
        request_prompt_and_generation_token_ids=True,
        uses_reasoning_parser=False,
        extra={"chat_template_kwargs": {"enable_thinking": False}},
    )
    config = build_stack_config(venv, ["toy"], model, allocate_ports=counting_ports()).global_config
    block = config["policy_model"]["responses_api_models"]["vllm_model"]
    assert block["entrypoint"] == "app.py"
    assert (block["base_url"], block["model"], block["api_key"]) == (
        "http://127.0.0.1:9/v1",
        "m",
        "k",
    )
    assert block["return_token_id_information"] is True
    assert block["request_prompt_and_generation_token_ids"] is True
    assert block["uses_reasoning_parser"] is False
    assert block["chat_template_kwargs"] == {"enable_thinking": False}
    assert config["policy_base_url"] == "http://127.0.0.1:9/v1"
    assert config["policy_model_name"] == "m"
    assert config["dry_run"] is False


def test_default_max_steps_only_fills_agents_without_one(shared: GymVenv) -> None:
    """default_max_steps is written where max_steps is absent and leaves shipped values."""
    config = build_stack_config(
        shared, ["toy", "capped"], MODEL, default_max_steps=7, allocate_ports=counting_ports()
    ).global_config
    assert config["toy_simple_agent"]["responses_api_agents"]["simple_agent"]["max_steps"] == 7
    assert config["capped_simple_agent"]["responses_api_agents"]["simple_agent"]["max_steps"] == 3


def test_overrides_deep_merge_and_may_pin_a_port(shared: GymVenv, tmp_path: Path) -> None:
    """Overrides merge into nested blocks; a port they pin is kept, not reallocated."""
    venv = shared
    overrides = {
        "toy": {"resources_servers": {"toy": {"port": 31999, "verified": True}}},
        "head_server": {"port": 31998},
    }
    stack = build_stack_config(
        venv, ["toy"], MODEL, overrides=overrides, allocate_ports=counting_ports()
    )
    block = stack.global_config["toy"]["resources_servers"]["toy"]
    assert (block["port"], block["verified"], block["domain"]) == (31999, True, "agent")
    assert stack.server("toy").port == 31999
    assert stack.head_port == 31998


def test_overrides_may_add_a_server_but_not_an_environment_server(
    shared: GymVenv, tmp_path: Path
) -> None:
    """An extra model server from overrides is started too; environment servers are refused."""
    venv = shared
    judge = {"judge": {"responses_api_models": {"vllm_model": MODEL.server_block()}}}
    stack = build_stack_config(
        venv, ["toy"], MODEL, overrides=judge, allocate_ports=counting_ports()
    )
    assert stack.server("judge").environment is None
    assert stack.server("judge").host == "127.0.0.1"
    relay = {"relay": copy.deepcopy(TOY_CONFIG["toy_environment_server"])}
    with pytest.raises(ConfigError, match="'relay' is an environment_servers instance"):
        build_stack_config(venv, ["toy"], MODEL, overrides=relay, allocate_ports=counting_ports())


def test_dangling_reference_is_a_config_error(shared: GymVenv, tmp_path: Path) -> None:
    """An agent pointing at a model server the stack does not run is refused, with names."""
    venv = shared
    model = PolicyModel(base_url="http://x/v1", model="m", instance_name="other_model")
    with pytest.raises(ConfigError, match=r"responses_api_models/'policy_model'.*other_model"):
        build_stack_config(venv, ["toy"], model, allocate_ports=counting_ports())


def test_unknown_environment_and_duplicates_are_config_errors(
    shared: GymVenv, tmp_path: Path
) -> None:
    """Unknown names, repeated names and an empty list are refused before anything starts."""
    venv = shared
    with pytest.raises(ConfigError, match="unknown NeMo Gym environment 'nope'"):
        build_stack_config(venv, ["nope"], MODEL)
    with pytest.raises(ConfigError, match="twice"):
        build_stack_config(venv, ["toy", "toy"], MODEL)
    with pytest.raises(ConfigError, match="at least one"):
        build_stack_config(venv, [], MODEL)


def test_instance_defined_by_two_environments_is_refused(shared: GymVenv) -> None:
    """Two environments may not define the same instance name."""
    with pytest.raises(ConfigError, match="defined by both 'toy' and 'twin'"):
        build_stack_config(shared, ["toy", "twin"], MODEL, allocate_ports=counting_ports())


def test_to_yaml_round_trips(shared: GymVenv, tmp_path: Path) -> None:
    """The YAML handed to the servers parses back to the same config."""
    venv = shared
    stack = build_stack_config(venv, ["toy"], MODEL, workdir=tmp_path / "w")
    assert yaml.safe_load(stack.to_yaml()) == stack.global_config
    assert stack.global_config["results_dir"] == str(tmp_path / "w" / "results")


def test_free_loopback_ports_are_distinct_bindable_and_below_ephemeral() -> None:
    """free_loopback_ports picks distinct bindable ports in 10001-20000 (not ephemeral)."""
    ports = free_loopback_ports(5)
    assert len(set(ports)) == 5
    assert all(10001 <= port <= 20000 for port in ports)
    for port in ports:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))


def test_free_loopback_ports_skips_ports_in_use() -> None:
    """A port already bound is never returned; an exhausted range is a ConfigError."""
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        port = busy.getsockname()[1]
        assert port not in free_loopback_ports(3, (port - 50, port))
        with pytest.raises(ConfigError, match="only 0 of 1"):
            free_loopback_ports(1, (port, port))


def test_every_catalogued_environment_builds(gym_venv: GymVenv) -> None:
    """Each shipped catalogue config resolves: one agent, one resources server, refs intact."""
    stack = build_stack_config(gym_venv, list(CATALOGUE), MODEL)
    assert len(stack.servers) == 2 * len(CATALOGUE) + 1
    for setup in stack.environments:
        assert len(setup.agents) == 1 and len(setup.resources_servers) == 1
        assert setup.dropped, "each shipped config has an environment server, not started"
        assert setup.example_path.is_file()


def _renamed(config: dict[str, object], name: str) -> dict[str, object]:
    text = yaml.safe_dump(config).replace("toy", name)
    loaded = yaml.safe_load(text)
    assert isinstance(loaded, dict)
    return loaded


def _split_toy(venv_root: Path) -> Path:
    """Move the toy's agent into an agent config that ``configs/toy.yaml`` includes."""
    site = venv_root / "lib" / "python3.13" / "site-packages"
    agent_config = site / "responses_api_agents" / "simple_agent" / "configs" / "toy_agent.yaml"
    agent_config.parent.mkdir(parents=True)
    agent = copy.deepcopy(TOY_CONFIG["toy_simple_agent"])
    agent["responses_api_agents"]["simple_agent"]["max_steps"] = 3
    agent_config.write_text(yaml.safe_dump({"toy_simple_agent": agent}))
    own = {k: v for k, v in TOY_CONFIG.items() if k != "toy_simple_agent"}
    own["config_paths"] = ["responses_api_agents/simple_agent/configs/toy_agent.yaml"]
    # the including config overrides what it includes
    own["toy_simple_agent"] = {"responses_api_agents": {"simple_agent": {"max_steps": 5}}}
    config = site / "resources_servers" / "toy" / "configs" / "toy.yaml"
    config.write_text(yaml.safe_dump(own))
    return config


def test_config_paths_are_merged_under_the_including_config(tmp_path: Path) -> None:
    """An included agent config is merged in; the including config's values win."""
    venv = make_venv(tmp_path / "venv")
    _split_toy(tmp_path / "venv")
    loaded = load_environment_config(venv, "toy")
    assert loaded["config_paths"][-1] == "responses_api_agents/simple_agent/configs/toy_agent.yaml"
    agent = loaded["toy_simple_agent"]["responses_api_agents"]["simple_agent"]
    assert agent["max_steps"] == 5
    assert agent["resources_server"] == {"type": "resources_servers", "name": "toy"}
    stack = build_stack_config(venv, ["toy"], MODEL, allocate_ports=counting_ports())
    started = {s.instance: s for s in stack.servers}
    assert started["toy_simple_agent"].environment == "toy"
    agents = stack.global_config["toy_simple_agent"]["responses_api_agents"]
    assert agents["simple_agent"]["max_steps"] == 5


def test_config_paths_missing_is_a_config_error_a_cycle_is_read_once(tmp_path: Path) -> None:
    """NeMo Gym's rules: an include that is nowhere is an error naming where it looked; a
    config that includes itself again is read once (a duplicate, not an error)."""
    venv = make_venv(tmp_path / "venv")
    config = _split_toy(tmp_path / "venv")
    own = yaml.safe_load(config.read_text())
    own["config_paths"] = ["responses_api_agents/simple_agent/configs/nope.yaml"]
    config.write_text(yaml.safe_dump(own))
    with pytest.raises(ConfigError, match=r"ConfigPathNotFoundError: .*nope\.yaml' was not found"):
        load_environment_config(venv, "toy")
    own["config_paths"] = [
        "resources_servers/toy/configs/toy.yaml",
        "responses_api_agents/simple_agent/configs/toy_agent.yaml",
    ]
    config.write_text(yaml.safe_dump(own))
    loaded = load_environment_config(venv, "toy")
    assert loaded["toy_simple_agent"]["responses_api_agents"]["simple_agent"]["max_steps"] == 5


def test_a_config_variant_is_chosen_with_a_colon(tmp_path: Path) -> None:
    """``toy:other`` starts ``configs/other.yaml``; a directory without its own config
    names its variants in the error."""
    venv = make_venv(tmp_path / "venv")
    configs = tmp_path / "venv" / "lib" / "python3.13" / "site-packages" / "resources_servers"
    variant = copy.deepcopy(TOY_CONFIG)
    variant["toy"]["resources_servers"]["toy"]["description"] = "the other variant"
    (configs / "toy" / "configs" / "other.yaml").write_text(yaml.safe_dump(variant))
    loaded = load_environment_config(venv, "toy:other")
    assert loaded["toy"]["resources_servers"]["toy"]["description"] == "the other variant"
    stack = build_stack_config(venv, ["toy:other"], MODEL, allocate_ports=counting_ports())
    assert [e.name for e in stack.environments] == ["toy:other"]
    (configs / "toy" / "configs" / "toy.yaml").unlink()
    with pytest.raises(ConfigError, match=r"no config toy\.yaml; pick one .*'toy:<config>': other"):
        load_environment_config(venv, "toy")
    for bad in ("toy:", ":other", "toy:../x"):
        with pytest.raises(ConfigError, match="not an environment name"):
            load_environment_config(venv, bad)


def _agent_less(venv_root: Path, allowed: list[str]) -> None:
    """An environment ``lonely`` with a resources server only, accepting ``allowed``, and
    ``simple_agent``'s own config (bound to another resources server, with datasets)."""
    site = venv_root / "lib" / "python3.13" / "site-packages"
    resources = copy.deepcopy(TOY_CONFIG["toy"]["resources_servers"]["toy"])
    resources["allowed_agents"] = allowed
    lonely = site / "resources_servers" / "lonely"
    (lonely / "configs").mkdir(parents=True)
    (lonely / "data").mkdir()
    (lonely / "data" / "example.jsonl").write_text("{}\n")
    config = {"lonely_rs": {"resources_servers": {"lonely": resources}}}
    (lonely / "configs" / "lonely.yaml").write_text(yaml.safe_dump(config))
    agent = copy.deepcopy(TOY_CONFIG["toy_simple_agent"])
    agent["responses_api_agents"]["simple_agent"]["resources_server"]["name"] = "example_rs"
    own = {
        "simple_agent": agent,
        "example_rs": {"resources_servers": {"example": {"entrypoint": "app.py"}}},
        "other_agent": {"responses_api_agents": {"other": {"entrypoint": "app.py"}}},
        "simple_agent_environment_server": TOY_CONFIG["toy_environment_server"],
        "agent_prompt": "be brief",
    }
    path = site / "responses_api_agents" / "simple_agent" / "configs" / "simple_agent.yaml"
    path.parent.mkdir(parents=True)
    path.write_text(yaml.safe_dump(own))


def _servers(config: dict[str, object]) -> list[str]:
    return sorted(name for name, block in config.items() if server_type_of(block) is not None)


def test_an_environment_without_an_agent_is_paired_with_an_allowed_one(tmp_path: Path) -> None:
    """A resources server alone runs with the first ``allowed_agents`` entry that ships a
    config: that agent, bound to it, its datasets left for the environment's own rows."""
    venv = make_venv(tmp_path / "venv")
    _agent_less(tmp_path / "venv", ["not_shipped", "simple_agent"])
    loaded = load_environment_config(venv, "lonely")
    assert _servers(loaded) == ["lonely_rs", "simple_agent"]
    assert loaded["agent_prompt"] == "be brief"
    agent = loaded["simple_agent"]["responses_api_agents"]["simple_agent"]
    assert agent["resources_server"] == {"type": "resources_servers", "name": "lonely_rs"}
    assert "datasets" not in agent
    stack = build_stack_config(venv, ["lonely"], MODEL, allocate_ports=counting_ports())
    (setup,) = stack.environments
    assert (setup.agents, setup.resources_servers) == (("simple_agent",), ("lonely_rs",))
    assert setup.example_path == venv.site_packages / "resources_servers/lonely/data/example.jsonl"
    assert setup.allowed_agents == ("not_shipped", "simple_agent")
    assert setup.agent == "simple_agent"


def test_allowed_agents_are_read_by_nemo_gym_a_bare_string_is_one_agent(tmp_path: Path) -> None:
    """What each resources server accepts, in config order, as NeMo Gym's
    ``allowed_agents_for`` reads it."""
    toy = copy.deepcopy(TOY_CONFIG)
    toy["toy"]["resources_servers"]["toy"]["allowed_agents"] = "simple_agent"
    toy["other"] = {
        "resources_servers": {"o": {"entrypoint": "app.py", "allowed_agents": ["a", "b"]}}
    }
    venv = make_venv(tmp_path / "venv", {"toy": toy})
    stack = build_stack_config(venv, ["toy"], MODEL, allocate_ports=counting_ports())
    assert stack.environments[0].allowed_agents == ("a", "b", "simple_agent")  # other, toy


def test_no_pairing_when_the_config_has_an_agent_or_no_allowed_agent_ships_one(
    tmp_path: Path,
) -> None:
    venv = make_venv(tmp_path / "venv")
    _agent_less(tmp_path / "venv", ["not_shipped"])
    assert _servers(load_environment_config(venv, "lonely")) == ["lonely_rs"]
    toy = venv.site_packages / "resources_servers" / "toy" / "configs" / "toy.yaml"
    config = yaml.safe_load(toy.read_text())
    config["toy"]["resources_servers"]["toy"]["allowed_agents"] = ["simple_agent"]
    toy.write_text(yaml.safe_dump(config))
    assert "simple_agent" not in load_environment_config(venv, "toy")


def test_gdpval_is_paired_with_the_stirrup_agent(gym_venv: GymVenv) -> None:
    """NeMo Gym's gdpval ships no agent; its ``allowed_agents`` names stirrup_agent."""
    loaded = load_environment_config(gym_venv, "gdpval")
    agent = loaded["stirrup_agent"]["responses_api_agents"]["stirrup_agent"]
    assert agent["resources_server"]["name"] == "gdpval_resources_server"
    stack = build_stack_config(gym_venv, ["gdpval"], MODEL, allocate_ports=counting_ports())
    (setup,) = stack.environments
    assert setup.agent_impls == ("stirrup_agent",)
    assert setup.example_path.is_file()


def test_a_policy_model_the_environment_defines_is_replaced_by_the_stacks(tmp_path: Path) -> None:
    """``nemo_user_sim`` ships a default ``policy_model``; the stack's policy takes its place.
    A server of that name that is no model server is refused (NeMo Gym's parser, which
    resolves it over its stand-in policy, trips on it)."""
    with_default = copy.deepcopy(TOY_CONFIG)
    with_default["policy_model"] = {
        "responses_api_models": {
            "vllm_model": {"entrypoint": "app.py", "base_url": "${policy_base_url}", "model": "x"}
        }
    }
    venv = make_venv(tmp_path / "venv", {"toy": with_default})
    config = build_stack_config(venv, ["toy"], MODEL, allocate_ports=counting_ports()).global_config
    block = config["policy_model"]["responses_api_models"]["vllm_model"]
    assert (block["base_url"], block["model"]) == (MODEL.base_url, MODEL.model)
    clash = copy.deepcopy(TOY_CONFIG)
    clash["policy_model"] = copy.deepcopy(TOY_CONFIG["toy"])
    venv = make_venv(tmp_path / "other", {"toy": clash})
    with pytest.raises(
        ConfigError,
        match=r"^toy: NeMo Gym's config parser refused .*StopIteration: raised in global_config",
    ):
        build_stack_config(venv, ["toy"], MODEL, allocate_ports=counting_ports())
