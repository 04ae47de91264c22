"""NeMo Gym's config directives (``_inherit_from``, ``_copy``, ``_delete_key``) and variants,
as its own parser carries them out for the stack; every shipped config builds but three.

The toy environments of one miniature venv are resolved together, in one request to the
NeMo Gym worker (:func:`resolve_each`), as a stack resolves its environments."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from nemogym_sdk.errors import ConfigError
from nemogym_sdk.gym import (
    DatasetMissingError,
    GymVenv,
    PolicyModel,
    ResolvedEnvironment,
    ServerDirectoryMissingError,
    StackBuilder,
    build_stack_config,
)
from nemogym_sdk.gym.loading import environment_config
from nemogym_sdk.gym.resolve import resolve_each

from .fakes import TOY_CONFIG, counting_ports, make_venv

MODEL = PolicyModel(base_url="http://127.0.0.1:8000/v1", model="tiny")
AGENT = {"responses_api_agents": {"opencode": {"entrypoint": "app.py", "steps": 5, "x": 1}}}
TOY = {"toy": TOY_CONFIG["toy"]}

ENVIRONMENTS: dict[str, dict[str, Any]] = {
    "inherit": {
        **TOY,
        "opencode_agent": AGENT,
        "swe_agent": {
            "_inherit_from": "opencode_agent",
            "responses_api_agents": {"opencode": {"steps": 9, "resources_server": "swe"}},
        },
    },
    "copies": {
        **TOY,
        "base": {"inner": {"a": 1, "b": 2}},
        "moved": {"_inherit_from": "base.inner", "c": 3},
        "copied": {"_copy": "base.inner", "_delete_key": "a, b", "d": 4},
        "value": "${copy:kept.inner.b}",
        "kept": {"inner": {"b": 2}},
        "taken": {"k": "${inherit_from:other.v}"},
        "other": {"v": 7, "w": 8},
        "trimmed": {"a": 1, "b": 2, "_delete_key": "b, absent"},
        "simulator_model": {"_copy": "policy_model"},
    },
    "missing_path": {**TOY, "a": {"_inherit_from": "missing"}},
    "not_a_mapping": {**TOY, "x": {"a": {"_copy": "b.c"}}, "b": {"c": 1}},
}


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> GymVenv:
    """One miniature venv: the toy, the directive environments, two variants of the toy
    and ``simple_agent``'s own config (which a variant includes)."""
    root = tmp_path_factory.mktemp("directives") / "venv"
    venv = make_venv(root, {"toy": TOY_CONFIG, **ENVIRONMENTS})
    shipped = venv.server_dir("responses_api_agents", "simple_agent") / "configs"
    shipped.mkdir(parents=True)
    generic = copy.deepcopy(TOY_CONFIG["toy_simple_agent"])
    generic["responses_api_agents"]["simple_agent"]["max_steps"] = 50
    (shipped / "simple_agent.yaml").write_text(yaml.safe_dump({"simple_agent": generic}))
    variant = {
        "config_paths": ["responses_api_agents/simple_agent/configs/simple_agent.yaml"],
        **TOY,
        "toy_inherited_agent": {
            "_inherit_from": "simple_agent",
            "responses_api_agents": {"simple_agent": {"max_steps": 4}},
        },
    }
    configs = venv.resources_server_dir("toy") / "configs"
    (configs / "inherited.yaml").write_text(yaml.safe_dump(variant))
    overlay = {"toy": {"resources_servers": {"toy": {"description": "judged locally"}}}}
    (configs / "local.yaml").write_text(yaml.safe_dump(overlay))
    return venv


@pytest.fixture(scope="module")
def resolved(venv: GymVenv) -> dict[str, ResolvedEnvironment | ConfigError]:
    """Every environment of the venv, resolved in one request to the NeMo Gym worker."""
    return resolve_each(venv, [*ENVIRONMENTS, "toy:inherited", "toy:local"])


def _config(resolved: dict[str, ResolvedEnvironment | ConfigError], name: str) -> dict[str, Any]:
    found = resolved[name]
    assert isinstance(found, ResolvedEnvironment), found
    return environment_config(found)


def test_inherit_moves_the_source_and_merges_over_it(
    resolved: dict[str, ResolvedEnvironment | ConfigError],
) -> None:
    """The block builds on the source (its own keys win) and the source is gone."""
    config = _config(resolved, "inherit")
    assert "opencode_agent" not in config
    assert config["swe_agent"]["responses_api_agents"]["opencode"] == {
        "entrypoint": "app.py",
        "steps": 9,
        "x": 1,
        "resources_server": "swe",
    }


def test_copy_keeps_the_source_paths_are_dotted_and_read_before_any_move(
    resolved: dict[str, ResolvedEnvironment | ConfigError],
) -> None:
    """Copies leave the source; string forms take a value; a copy reads the source as it
    was before any move, so a copy of something another block moves still sees it; ``_delete_key``
    removes keys after the merge and passes over keys that are not there; a copy of the
    policy is NeMo Gym's stand-in model server (``dummy_model``), which the stack wires."""
    config = _config(resolved, "copies")
    assert config["moved"] == {"a": 1, "b": 2, "c": 3}
    assert config["base"] == {}  # inner moved away
    assert config["copied"] == {"d": 4}
    assert config["value"] == 2 and config["kept"] == {"inner": {"b": 2}}
    assert config["taken"] == {"k": 7} and config["other"] == {"w": 8}
    assert config["trimmed"] == {"a": 1}
    assert config["simulator_model"] == {
        "responses_api_models": {"dummy_model": {"entrypoint": "app.py"}}
    }
    assert "policy_model" not in config  # the stand-in policy is left for the stack to add


@pytest.mark.parametrize(
    ("name", "error"),
    [
        ("missing_path", "InheritPathNotFoundError: Path specified does not exist"),
        ("not_a_mapping", ""),
    ],
)
def test_directives_that_cannot_be_carried_out_name_the_environment_and_file(
    resolved: dict[str, ResolvedEnvironment | ConfigError], name: str, error: str
) -> None:
    """NeMo Gym's error, prefixed with the environment and its config file."""
    found = resolved[name]
    assert isinstance(found, ConfigError)
    prefix = f"{name}: NeMo Gym's config parser refused .*/resources_servers/{name}/configs/"
    with pytest.raises(ConfigError, match=f"^{prefix}{name}\\.yaml: .*{error}"):
        raise found


def test_a_variant_inheriting_an_included_agent_builds(
    venv: GymVenv, resolved: dict[str, ResolvedEnvironment | ConfigError]
) -> None:
    """As NeMo Gym's SWE variants do: include an agent's config, inherit its instance."""
    stack = build_stack_config(venv, ["toy:inherited"], MODEL, allocate_ports=counting_ports())
    (setup,) = stack.environments
    assert setup.agents == ("toy_inherited_agent",)
    agent = stack.global_config["toy_inherited_agent"]["responses_api_agents"]["simple_agent"]
    assert agent["max_steps"] == 4 and agent["entrypoint"] == "app.py"
    assert "simple_agent" not in stack.global_config
    assert stack.global_config["config_paths"][-1].endswith("simple_agent.yaml")


def test_an_overlay_variant_is_merged_over_the_directorys_own_config(
    resolved: dict[str, ResolvedEnvironment | ConfigError],
) -> None:
    """A variant whose server blocks lack an entrypoint adjusts ``configs/<dir>.yaml``."""
    config = _config(resolved, "toy:local")
    block = config["toy"]["resources_servers"]["toy"]
    assert (block["description"], block["entrypoint"]) == ("judged locally", "app.py")
    assert "toy_simple_agent" in config


def _shipped_names(venv: GymVenv) -> list[str]:
    names = []
    for directory in sorted((venv.site_packages / "resources_servers").iterdir()):
        for config in sorted(directory.glob("configs/*.yaml")):
            stem = "" if config.stem == directory.name else f":{config.stem}"
            names.append(f"{directory.name}{stem}")
    return names


REFUSALS = {
    "genrm_compare": "genrm_compare: model server 'genrm_model' is a genrm_model server, "
    "which the stack cannot point at an OpenAI-compatible judge endpoint",
    "nemo_user_sim": "agent 'nemo_user_sim_user' samples from 'user_model' (model_server), "
    "a vllm_model server its environment declares",
    "ns_tools": "server 'ns_tools' references resources_servers/'math_with_judge', which "
    "the stack does not start; available resources_servers: ns_tools",
}


def test_every_shipped_config_builds_but_three(gym_venv: GymVenv, tmp_path: Path) -> None:
    """All 242 configs of NeMo Gym 0.7.0 (variants included), resolved by one NeMo Gym
    process, build, but the three the stack refuses on purpose: a GenRM judge, an agent
    sampling from a declared model server, and a resources server calling another
    environment's. Of those that build, two name example rows the wheel does not ship: a
    stack of them is refused before anything starts."""
    names = _shipped_names(gym_venv)
    assert len(names) == 242
    unresolved = {
        n: r for n, r in resolve_each(gym_venv, names).items() if isinstance(r, Exception)
    }
    assert unresolved == {}
    refused, missing = {}, {}
    for name in names:
        try:
            config = build_stack_config(gym_venv, [name], MODEL, allocate_ports=counting_ports())
        except ConfigError as error:
            refused[name] = str(error)
            continue
        (setup,) = config.environments
        if not setup.example_path.is_file():
            missing[name] = setup.example_path
    assert sorted(refused) == sorted(REFUSALS), refused
    for name, message in REFUSALS.items():
        assert refused[name].startswith(message), refused[name]
    assert sorted(missing) == [
        "structured_outputs:structured_outputs_json_yaml_xml_v1",
        "terminal_multi_harness:terminal_multi_harness_stirrup",
    ]
    name = "structured_outputs:structured_outputs_json_yaml_xml_v1"
    builder = StackBuilder(venv=gym_venv, environments=(name,), model=MODEL)
    with pytest.raises(DatasetMissingError) as caught:
        builder.build(tmp_path)
    assert caught.value.path == missing[name]
    assert str(caught.value.config_path).endswith("structured_outputs_json_yaml_xml_v1.yaml")
    assert str(missing[name]) in str(caught.value) and str(caught.value.config_path) in str(
        caught.value
    )


def test_a_config_naming_a_server_directory_nemo_gym_lacks_is_refused_before_starting(
    gym_venv: GymVenv, tmp_path: Path
) -> None:
    """Six ``ns_tools`` variants run their resources server from
    ``resources_servers/ns_tools_<tool>``, which nemo-gym 0.7.0 does not ship (their code
    is in ``ns_tools/``): the stack refuses each with a typed error naming the config, the
    server and the directory, instead of ``subprocess``'s bare ``FileNotFoundError``."""
    site = gym_venv.site_packages / "resources_servers"
    variants = sorted(p.stem for p in (site / "ns_tools" / "configs").glob("ns_tools_*.yaml"))
    assert len(variants) == 6, variants
    for variant in variants:
        name = f"ns_tools:{variant}"
        with pytest.raises(ServerDirectoryMissingError) as caught:
            StackBuilder(venv=gym_venv, environments=(name,), model=MODEL).build(tmp_path)
        error = caught.value
        assert (error.environment, error.server) == (name, f"resources_servers/{variant}")
        assert error.directory == site / variant and not error.directory.exists()
        assert error.config_path == site / "ns_tools" / "configs" / f"{variant}.yaml"
        assert str(error.config_path) in str(error) and str(error.directory) in str(error)
        assert isinstance(error, ConfigError)
