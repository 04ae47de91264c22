"""NeMo Gym's config directives (``_inherit_from``, ``_copy``, ``_delete_key``) and overlay
variants, as `load_environment_config` carries them out."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from nemogym_sdk.errors import ConfigError
from nemogym_sdk.gym import GymVenv, PolicyModel, build_stack_config
from nemogym_sdk.gym.directives import resolve_directives
from nemogym_sdk.gym.loading import load_environment_config

from .fakes import TOY_CONFIG, counting_ports, make_venv

MODEL = PolicyModel(base_url="http://127.0.0.1:8000/v1", model="tiny")
AGENT = {"responses_api_agents": {"opencode": {"entrypoint": "app.py", "steps": 5, "x": 1}}}


def test_inherit_moves_the_source_and_merges_over_it() -> None:
    """The block builds on the source (its own keys win) and the source is gone."""
    config = {
        "opencode_agent": AGENT,
        "swe_agent": {
            "_inherit_from": "opencode_agent",
            "responses_api_agents": {"opencode": {"steps": 9, "resources_server": "swe"}},
        },
    }
    resolved = resolve_directives(config, "swe.yaml")
    assert sorted(resolved) == ["swe_agent"]
    assert resolved["swe_agent"]["responses_api_agents"]["opencode"] == {
        "entrypoint": "app.py",
        "steps": 9,
        "x": 1,
        "resources_server": "swe",
    }
    assert config["opencode_agent"] == AGENT  # the input is not changed


def test_copy_keeps_the_source_paths_are_dotted_and_read_before_any_move() -> None:
    """Copies leave the source; string forms take a value; every path reads the config as
    it was, so a copy of something another block moves still sees it."""
    config = {
        "base": {"inner": {"a": 1, "b": 2}},
        "moved": {"_inherit_from": "base.inner", "c": 3},
        "copied": {"_copy": "base.inner", "_delete_key": "a, b", "d": 4},
        "value": "${copy:base.inner.b}",
        "taken": {"k": "${inherit_from:other.v}"},
        "other": {"v": 7, "w": 8},
        "trimmed": {"a": 1, "b": 2, "_delete_key": "b"},
        "simulator_model": {"_copy": "policy_model"},
    }
    resolved = resolve_directives(config, "c.yaml")
    assert resolved["moved"] == {"a": 1, "b": 2, "c": 3}
    assert resolved["base"] == {}  # inner moved away
    assert resolved["copied"] == {"d": 4}
    assert resolved["value"] == 2
    assert resolved["taken"] == {"k": 7} and resolved["other"] == {"w": 8}
    assert resolved["trimmed"] == {"a": 1}
    # a whole-instance copy of the policy is left for build_stack_config to wire
    assert resolved["simulator_model"] == {"_copy": "policy_model"}


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"a": {"_inherit_from": "missing"}}, "'a' builds on 'missing', which the config lacks"),
        (
            {"x": {"a": {"_copy": "b.c"}}, "b": {"c": 1}},
            "'a' builds on 'b.c', which is not a mapping",
        ),
        ({"a": {"x": 1, "_delete_key": "y"}}, "'a' deletes y, which it lacks"),
    ],
)
def test_directives_that_cannot_be_carried_out_name_the_file_and_key(
    config: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError, match=f"^c.yaml: {message}"):
        resolve_directives(config, "c.yaml")


def _site(venv_root: Path) -> Path:
    return venv_root / "lib" / "python3.13" / "site-packages"


def test_a_variant_inheriting_an_included_agent_builds(tmp_path: Path) -> None:
    """As NeMo Gym's SWE variants do: include an agent's config, inherit its instance."""
    venv = make_venv(tmp_path / "venv")
    site = _site(tmp_path / "venv")
    shipped = site / "responses_api_agents" / "simple_agent" / "configs" / "simple_agent.yaml"
    shipped.parent.mkdir(parents=True)
    generic = copy.deepcopy(TOY_CONFIG["toy_simple_agent"])
    generic["responses_api_agents"]["simple_agent"]["max_steps"] = 50
    shipped.write_text(yaml.safe_dump({"simple_agent": generic}))
    variant = {
        "config_paths": ["responses_api_agents/simple_agent/configs/simple_agent.yaml"],
        "toy": TOY_CONFIG["toy"],
        "toy_inherited_agent": {
            "_inherit_from": "simple_agent",
            "responses_api_agents": {"simple_agent": {"max_steps": 4}},
        },
    }
    (site / "resources_servers/toy/configs/inherited.yaml").write_text(yaml.safe_dump(variant))
    stack = build_stack_config(venv, ["toy:inherited"], MODEL, allocate_ports=counting_ports())
    (setup,) = stack.environments
    assert setup.agents == ("toy_inherited_agent",)
    agent = stack.global_config["toy_inherited_agent"]["responses_api_agents"]["simple_agent"]
    assert agent["max_steps"] == 4 and agent["entrypoint"] == "app.py"
    assert "simple_agent" not in stack.global_config


def test_an_overlay_variant_is_merged_over_the_directorys_own_config(tmp_path: Path) -> None:
    """A variant whose server blocks lack an entrypoint adjusts ``configs/<dir>.yaml``."""
    venv = make_venv(tmp_path / "venv")
    overlay = {"toy": {"resources_servers": {"toy": {"description": "judged locally"}}}}
    path = _site(tmp_path / "venv") / "resources_servers/toy/configs/local.yaml"
    path.write_text(yaml.safe_dump(overlay))
    loaded = load_environment_config(venv, "toy:local")
    block = loaded["toy"]["resources_servers"]["toy"]
    assert (block["description"], block["entrypoint"]) == ("judged locally", "app.py")
    assert "toy_simple_agent" in loaded


def test_every_shipped_config_builds_but_three(gym_venv: GymVenv) -> None:
    """All 242 configs of NeMo Gym 0.7.0 (variants included) build, but the three the stack
    refuses on purpose: a GenRM judge, an agent sampling from a declared model server, and
    a resources server calling another environment's."""
    refused = {}
    count = 0
    for directory in sorted((gym_venv.site_packages / "resources_servers").iterdir()):
        for config in sorted(directory.glob("configs/*.yaml")):
            name = directory.name
            if config.stem != directory.name:
                name += f":{config.stem}"
            count += 1
            try:
                build_stack_config(gym_venv, [name], MODEL, allocate_ports=counting_ports())
            except ConfigError as error:
                refused[name] = str(error)
    assert count >= 240
    assert sorted(refused) == ["genrm_compare", "nemo_user_sim", "ns_tools"], refused
