"""Contract with the installed nemo-gym: the version the SDK is pinned to, the parser entry
points ``resolve_main.py`` calls, and the config format they produce.

``nemogym_sdk.gym`` resolves configs with NeMo Gym's own ``GlobalConfigDictParser`` (see
``nemogym_sdk/gym/resolve_main.py``). These tests fail loudly when a nemo-gym release
changes what that relies on: move the pin only with them (and the sweep) green.
"""

from __future__ import annotations

import copy
import json
import subprocess
from typing import Any

import pytest
import yaml

from nemogym_sdk import RolloutStatus, parse_agent_response
from nemogym_sdk.errors import ConfigError
from nemogym_sdk.gym import GymVenv, PolicyModel, ResolvedEnvironment, build_stack_config
from nemogym_sdk.gym.config import STACK_KEYS
from nemogym_sdk.gym.resolve import resolve_each
from nemogym_sdk.gym.server_envs import nemo_gym_version

from .fakes import TOY_CONFIG, counting_ports, make_venv

MODEL = PolicyModel(base_url="http://127.0.0.1:8000/v1", model="tiny")
PINNED = "0.7.0"
"""The nemo-gym the SDK is built and tested against (``Makefile``'s gym-venv, ``DESIGN.md``)."""

NEMO_GYM_DEFAULTS = {
    "allow_openai_version_skew",
    "cache_dir",
    "config_paths",
    "disallowed_ports",
    "dry_run",
    "head_server",
    "head_server_deps",
    "model_endpoint_readiness_timeout_seconds",
    "port_range_high",
    "port_range_low",
    "python_version",
    "results_dir",
    "server_spinup_timeout_seconds",
    "skip_venv_if_present",
    "use_absolute_ip",
    "uv_cache_dir",
    "uv_lock_timeout_seconds",
    "uv_venv_dir",
}
"""Top-level keys NeMo Gym's parser adds to a config that sets none (besides the
placeholder policy keys ``policy_base_url``, ``policy_api_key``, ``policy_model_name``)."""

SIGNATURES = """
import inspect, json
from nemo_gym import _resolve_under_cwd_or_install, __version__
from nemo_gym.global_config import (
    NEMO_GYM_RESERVED_TOP_LEVEL_KEYS, GlobalConfigDictParser, GlobalConfigDictParserConfig,
    allowed_agents_for,
)
from omegaconf import OmegaConf

P = GlobalConfigDictParser
names = ["parse", "validate_and_populate_defaults", "raise_on_missing_values",
         "collect_missing_value_paths", "compose_unbound_agent",
         "raise_on_unsupported_model_pairings"]
print(json.dumps({
    "version": __version__,
    "methods": {n: list(inspect.signature(getattr(P, n)).parameters) for n in names},
    "parse_calls": [n for n in names[1:] if f"self.{n}(" in inspect.getsource(P.parse)],
    "config_fields": sorted(GlobalConfigDictParserConfig.model_fields),
    "no_model": OmegaConf.to_container(GlobalConfigDictParserConfig.NO_MODEL_GLOBAL_CONFIG_DICT),
    "allowed_agents_for": list(inspect.signature(allowed_agents_for).parameters),
    "resolve_path": list(inspect.signature(_resolve_under_cwd_or_install).parameters),
    "reserved": NEMO_GYM_RESERVED_TOP_LEVEL_KEYS,
}))
"""


def test_the_installed_nemo_gym_is_the_pinned_version(gym_venv: GymVenv) -> None:
    """The venv's nemo-gym, and the one that resolves configs, is the pinned release."""
    assert nemo_gym_version(gym_venv) == PINNED, (
        f"nemogym_sdk.gym is pinned to nemo-gym {PINNED}; the venv has "
        f"{nemo_gym_version(gym_venv)}: run these contract tests and the sweep, then move the pin"
    )
    (resolved,) = resolve_each(gym_venv, ["example_single_tool_call"], cache=False).values()
    assert isinstance(resolved, ResolvedEnvironment)
    assert resolved.nemo_gym_version == PINNED


def test_the_parser_entry_points_the_resolver_calls(gym_venv: GymVenv) -> None:
    """``resolve_main.py`` subclasses ``GlobalConfigDictParser`` and defers three of the
    steps ``parse`` calls; their names, parameters and the calls must stay as they are."""
    done = subprocess.run(
        [str(gym_venv.python), "-c", SIGNATURES], capture_output=True, text=True, check=True
    )
    facts: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    assert facts["version"] == PINNED
    assert facts["methods"] == {
        "parse": ["self", "parse_config"],
        "validate_and_populate_defaults": [
            "self",
            "server_instance_configs",
            "default_host",
            "port_range_low",
            "port_range_high",
            "initial_disallowed_ports",
            "skip_verification",
            "skip_verification_reward",
            "probe_ports",
        ],
        "raise_on_missing_values": ["self", "global_config_dict"],
        "collect_missing_value_paths": ["self", "config"],
        "compose_unbound_agent": ["self", "global_config_dict", "held_agent_overrides"],
        "raise_on_unsupported_model_pairings": ["self", "global_config_dict"],
    }
    assert facts["parse_calls"] == [
        "validate_and_populate_defaults",
        "raise_on_missing_values",
        "compose_unbound_agent",
        "raise_on_unsupported_model_pairings",
    ]
    assert {"initial_global_config_dict", "skip_load_from_cli", "skip_load_from_dotenv"} <= set(
        facts["config_fields"]
    ) and "offline" in facts["config_fields"]
    assert facts["no_model"]["policy_model"] == {
        "responses_api_models": {"dummy_model": {"entrypoint": "app.py"}}
    }
    assert facts["allowed_agents_for"] == ["global_config_dict", "resources_server_name"]
    assert facts["resolve_path"] == ["rel_path", "validator"]
    # the keys the stack sets itself are NeMo Gym's own (bar the placeholder policy keys)
    placeholder = {"policy_base_url", "policy_api_key", "policy_model_name"}
    assert STACK_KEYS - placeholder <= set(facts["reserved"])


def _toy(**extra: Any) -> dict[str, Any]:
    config = copy.deepcopy(TOY_CONFIG)
    config.update(extra)
    return config


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> GymVenv:
    """Toy environments for NeMo Gym's format rules: include precedence, ``???``, a
    generated relay, a model-pairing refusal."""
    root = tmp_path_factory.mktemp("contract") / "venv"
    no_relay = _toy()
    del no_relay["toy_environment_server"]
    judged = _toy()
    judged["toy"]["resources_servers"]["toy"]["judge_model_server"] = {
        "type": "responses_api_models",
        "name": "???",
    }
    picky = _toy()
    picky["toy"]["resources_servers"]["toy"]["allowed_model_types"] = ["openai_model"]
    environments = {"toy": TOY_CONFIG, "no_relay": no_relay, "judged": judged, "picky": picky}
    venv = make_venv(root, environments)
    site = venv.site_packages
    inner = {"toy": {"resources_servers": {"toy": {"level": "inner", "inner_only": 1}}}}
    middle = {
        "config_paths": ["includes/inner.yaml"],
        "toy": {"resources_servers": {"toy": {"level": "middle", "sibling": "first"}}},
    }
    second = {"toy": {"resources_servers": {"toy": {"sibling": "second"}}}}
    top = _toy(config_paths=["includes/middle.yaml", "includes/second.yaml"])
    top["toy"]["resources_servers"]["toy"]["level"] = "top"
    (site / "includes").mkdir()
    for name, config in (("inner", inner), ("middle", middle), ("second", second)):
        (site / "includes" / f"{name}.yaml").write_text(yaml.safe_dump(config))
    (site / "resources_servers" / "toy" / "configs" / "nested.yaml").write_text(yaml.safe_dump(top))
    return venv


@pytest.fixture(scope="module")
def resolved(venv: GymVenv) -> dict[str, ResolvedEnvironment | ConfigError]:
    return resolve_each(venv, ["toy", "no_relay", "judged", "picky", "toy:nested"])


def _ok(resolved: dict[str, ResolvedEnvironment | ConfigError], name: str) -> ResolvedEnvironment:
    found = resolved[name]
    assert isinstance(found, ResolvedEnvironment), found
    return found


def test_the_defaults_the_parser_adds(
    resolved: dict[str, ResolvedEnvironment | ConfigError],
) -> None:
    """Exactly these top-level keys come from NeMo Gym for a config that sets none."""
    config = _ok(resolved, "toy").config
    servers = {"toy", "toy_simple_agent", "toy_environment_server"}
    placeholder = {"policy_base_url", "policy_api_key", "policy_model_name"}
    assert set(config) - servers - placeholder == NEMO_GYM_DEFAULTS
    assert (config["port_range_low"], config["port_range_high"]) == (10001, 20000)
    assert config["dry_run"] is False and config["python_version"].startswith("3.13")


def test_includes_are_overridden_by_the_including_config_later_siblings_win(
    resolved: dict[str, ResolvedEnvironment | ConfigError],
) -> None:
    """``config_paths`` precedence: includer over included however deep, later sibling
    over earlier; every file read is listed, for the resolver's cache."""
    toy = _ok(resolved, "toy:nested")
    block = toy.config["toy"]["resources_servers"]["toy"]
    assert (block["level"], block["sibling"], block["inner_only"]) == ("top", "second", 1)
    assert [p.name for p in toy.files] == [
        "nested.yaml",
        "middle.yaml",
        "second.yaml",
        "inner.yaml",
    ]


def test_unset_values_are_reported_and_an_unset_judge_is_the_stacks(
    venv: GymVenv, resolved: dict[str, ResolvedEnvironment | ConfigError]
) -> None:
    """A ``???`` is reported (not raised); a model reference left ``???`` is the judge."""
    judged = _ok(resolved, "judged")
    assert judged.missing == ("toy.resources_servers.toy.judge_model_server.name",)
    stack = build_stack_config(venv, ["judged"], MODEL, allocate_ports=counting_ports())
    block = stack.global_config["toy"]["resources_servers"]["toy"]
    assert block["judge_model_server"] == {"type": "responses_api_models", "name": "judge_model"}
    assert stack.server("judge_model").server_type == "responses_api_models"


def test_an_agent_without_an_environment_server_gets_a_relay_the_stack_drops(
    venv: GymVenv, resolved: dict[str, ResolvedEnvironment | ConfigError]
) -> None:
    """NeMo Gym generates a ``legacy_agent`` relay for it; the stack does not start it."""
    config = _ok(resolved, "no_relay").config
    relay = config["toy_environment_server"]["environment_servers"]["legacy_agent"]
    assert relay["agent_server"] == {"type": "responses_api_agents", "name": "toy_simple_agent"}
    stack = build_stack_config(venv, ["no_relay"], MODEL, allocate_ports=counting_ports())
    assert stack.environments[0].dropped == ("toy_environment_server",)


def test_a_workload_the_policy_server_cannot_carry_is_refused(
    resolved: dict[str, ResolvedEnvironment | ConfigError],
) -> None:
    """NeMo Gym's ``allowed_model_types`` check, against the ``vllm_model`` the stack serves
    the policy with."""
    refused = resolved["picky"]
    assert isinstance(refused, ConfigError)
    assert "UnsupportedModelPairingError" in str(refused) and "openai_model" in str(refused)


def test_dataset_paths_resolve_against_the_environments_root(
    resolved: dict[str, ResolvedEnvironment | ConfigError], venv: GymVenv
) -> None:
    """``jsonl_fpath`` as NeMo Gym reads it: under the environment's root first."""
    toy = _ok(resolved, "toy")
    relative = "resources_servers/toy/data/example.jsonl"
    assert toy.datasets == {relative: venv.site_packages / relative}


FAILURE_ROWS = """
import json
from nemo_gym.rollout_collection import (
    _agent_request_failure_row, _dispatch_drained_result, _episode_record,
)
class Failed(Exception):
    response_content = b"ValueError(no tool named search)"
rows = [
    _agent_request_failure_row(Failed("500, message='Internal Server Error'"), 500),
    _agent_request_failure_row(ConnectionResetError("reset by peer"), None),
    _agent_request_failure_row(Failed("503, message='Service Unavailable'"), 503),
    _episode_record({"task_id": 3, "failure": {
        "failure_reason": "the sandbox crashed", "stage": "verification", "terminal": True}}),
    _dispatch_drained_result(12.0, 30.0),
]
print(json.dumps(rows))
"""


def test_nemo_gyms_own_failure_rows_parse_as_typed_failures(gym_venv: GymVenv) -> None:
    """The rows the installed NeMo Gym's rollout collection writes for a rollout without a
    result (``route_failures_to_sidecar``: the agent broke, or never answered; an
    environment server's failure; a row its dispatch budget never started), made by its
    own code, parse as typed failures carrying its reason, never as ``empty``."""
    done = subprocess.run(
        [str(gym_venv.python), "-c", FAILURE_ROWS], capture_output=True, text=True, check=True
    )
    rows = json.loads(done.stdout.splitlines()[-1])
    parsed = [parse_agent_response(row, eos_token_id=2) for row in rows]
    assert [r.status for r in parsed] == [
        RolloutStatus.AGENT_ERROR,
        RolloutStatus.TRANSPORT_ERROR,
        RolloutStatus.TRANSPORT_ERROR,
        RolloutStatus.AGENT_ERROR,
        RolloutStatus.TIMEOUT,
    ]
    reasons = [r.error or "" for r in parsed]
    assert reasons[0].startswith("NeMo Gym agent_run_error (HTTP 500, Failed): 500, message=")
    assert reasons[0].endswith("; body: ValueError(no tool named search)")
    assert reasons[1] == "NeMo Gym agent_request_failed (ConnectionResetError): reset by peer"
    assert "agent_request_failed (HTTP 503, Failed)" in reasons[2]
    assert reasons[3] == (
        "NeMo Gym environment_server_failed (stage verification, terminal): the sandbox crashed"
    )
    assert reasons[4].startswith("NeMo Gym cancelled: not dispatched: 12s left")
