"""The public surface and the layering rules."""

from __future__ import annotations

import ast
import importlib
import inspect
import subprocess
import sys
from pathlib import Path

import pytest

import nemogym_sdk

PACKAGE = Path(nemogym_sdk.__file__).parent
CORE = [
    "__init__",
    "errors",
    "records",
    "wire",
    "hosts",
    "turns",
    "masks",
    "collate",
    "data",
    "rewards",
    "grpo",
]
HEAVY = ["torch", "trl", "transformers", "vllm", "axolotl", "peft"]
NETWORK = ["aiohttp", "requests", "yaml"]  # loaded on first use of the network layer


def test_all_is_sorted_unique_and_importable() -> None:
    """__all__ is sorted, has no duplicates, and every name resolves."""
    names = nemogym_sdk.__all__
    assert names == sorted(names, key=str.lower) or names == sorted(names)
    assert len(set(names)) == len(names)
    for name in names:
        assert getattr(nemogym_sdk, name) is not None


def test_fixed_public_names_exist() -> None:
    """The design's fixed names are exported."""
    fixed = {
        "parse_agent_response",
        "Rollout",
        "RolloutStatus",
        "collate",
        "Batch",
        "normalize_host",
        "reward_env",
        "load_rows",
    }
    assert fixed <= set(nemogym_sdk.__all__)


def test_fixed_signatures() -> None:
    """Signatures the design fixes keep their parameters."""
    params = inspect.signature(nemogym_sdk.parse_agent_response).parameters
    assert list(params)[:2] == ["response", "eos_token_id"]
    assert params["on_drift"].kind is inspect.Parameter.KEYWORD_ONLY
    assert params["max_completion_length"].default is None
    assert list(inspect.signature(nemogym_sdk.normalize_host).parameters) == ["host", "fallback"]
    assert (
        inspect.signature(nemogym_sdk.normalize_host).parameters["fallback"].default == "127.0.0.1"
    )
    collate_params = inspect.signature(nemogym_sdk.collate).parameters
    assert collate_params["pad_token_id"].kind is inspect.Parameter.KEYWORD_ONLY
    assert [f.name for f in __import__("attrs").fields(nemogym_sdk.Rollout)][:6] == [
        "prompt_ids",
        "completion_ids",
        "env_mask",
        "logprobs",
        "reward",
        "num_turns",
    ]


def test_import_leaves_heavy_frameworks_out() -> None:
    """import nemogym_sdk in a fresh interpreter loads no torch/trl/transformers/vllm/axolotl."""
    code = f"import sys, nemogym_sdk; print(','.join(m for m in {HEAVY!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_network_names_load_lazily() -> None:
    """AgentClient and friends resolve on first access and are the modules' own objects."""
    from nemogym_sdk import client, directory, verify

    assert nemogym_sdk.AgentClient is client.AgentClient
    assert nemogym_sdk.ServerDirectory is directory.ServerDirectory
    assert nemogym_sdk.reward_nemo_gym_verify is verify.reward_nemo_gym_verify
    assert "Verifier" in dir(nemogym_sdk)


def test_import_is_quiet() -> None:
    """Importing configures no logging handlers and prints nothing."""
    code = (
        "import logging, nemogym_sdk; "
        "print(len(logging.getLogger().handlers), len(logging.getLogger('nemogym_sdk').handlers))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "0 0" and out.stderr == ""


def _module_level_imports(path: Path) -> set[str]:
    """Top-level packages imported when the module loads (lazy and TYPE_CHECKING ones aside)."""
    found: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return found


def test_core_imports_only_allowed_dependencies() -> None:
    """Core modules import the standard library, attrs, numpy, simdjson and nemogym_sdk only."""
    allowed = {"attrs", "numpy", "simdjson", "nemogym_sdk"} | set(sys.stdlib_module_names)
    for name in CORE:
        module = PACKAGE / f"{name}.py"
        for path in [module] if module.exists() else sorted((PACKAGE / name).glob("*.py")):
            extra = _module_level_imports(path) - allowed
            assert not extra, f"{path.relative_to(PACKAGE)} imports {sorted(extra)}"


def test_training_io_and_launch_layers_load_no_heavy_framework() -> None:
    """grpo, lora and gym (advantages, LoRA sync, stacks) import without torch or peft:
    only adapters.torch and the functions that save an adapter need them."""
    code = (
        "import sys, nemogym_sdk.grpo, nemogym_sdk.lora, nemogym_sdk.gym; "
        f"print(','.join(m for m in {HEAVY!r} if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_deployment_and_failure_policy_additions_are_exported() -> None:
    """The parse-options record (eager) and the reward function's counters and cache (lazy,
    with the network layer)."""
    from nemogym_sdk import records, verify

    assert nemogym_sdk.ParseOptions is records.ParseOptions
    assert nemogym_sdk.verify_stats is verify.verify_stats
    assert nemogym_sdk.clear_verifier_cache is verify.clear_verifier_cache
    assert "retry_timeouts" in {f.name for f in __import__("attrs").fields(nemogym_sdk.RetryPolicy)}
    assert not nemogym_sdk.RetryPolicy().retry_timeouts


# The public surface of every package, locked: a name added to or dropped from an
# ``__all__`` is a decision, made here too. The top level holds what a trainer author uses
# (a name no adapter, doc or example uses stays in its module).
SURFACE: dict[str, set[str]] = {
    "nemogym_sdk": {
        "Advantages",
        "AgentClient",
        "Batch",
        "ConfigError",
        "DataError",
        "DeadlineError",
        "DiscoveryError",
        "DriftError",
        "DriftPolicy",
        "EngineClosedError",
        "EngineOptions",
        "EngineStalledError",
        "EngineStep",
        "LoraSync",
        "LoraSyncError",
        "NemoGymError",
        "NotReadyError",
        "ParseOptions",
        "RawRun",
        "RetryPolicy",
        "Rollout",
        "RolloutEngine",
        "RolloutRequest",
        "RolloutStats",
        "RolloutStatus",
        "SamplingParams",
        "Scaling",
        "ServerDirectory",
        "ServerError",
        "SyncRecord",
        "TaskRow",
        "Timeouts",
        "TransportError",
        "UnknownAgentError",
        "UsageError",
        "Verifier",
        "VerifyItem",
        "VerifyResult",
        "__version__",
        "base_url",
        "check_served_name",
        "clear_verifier_cache",
        "collate",
        "compute_advantages",
        "expand_groups",
        "group_advantages",
        "install_lora_sync",
        "load_rows",
        "normalize_host",
        "parse_agent_response",
        "probe_lora_support",
        "reward_env",
        "reward_nemo_gym_verify",
        "routable_host",
        "verify_stats",
    },
    "nemogym_sdk.wire": {
        "ABORT_EPISODE_ROUTE",
        "AGENTS",
        "AGENT_REF",
        "CARD_MAX_NUM_SEQS_FIELD",
        "CARD_VERSIONS_FIELD",
        "CARD_VERSIONS_KEPT_FIELD",
        "CONFIG_PATH",
        "CONTENT",
        "ENVIRONMENT_SERVERS",
        "EPISODE_ID",
        "EPISODE_ID_PARAM",
        "ERROR",
        "FUNCTION_CALL",
        "GENERATION_LOG_PROBS",
        "GENERATION_TOKEN_IDS",
        "HOST",
        "INPUT",
        "ITEM_TYPE",
        "LOAD_VERSION_FIELD",
        "MASK_SAMPLE",
        "MAX_OUTPUT_TOKENS",
        "MESSAGE",
        "MODELS",
        "MODEL_NAME_KEYS",
        "ModelTurn",
        "NAME",
        "OUTPUT",
        "OUTPUT_TEXT",
        "POLICY_VERSION_PREFIX",
        "PORT",
        "PROCESS_NAME",
        "PROMPT_TOKEN_IDS",
        "RESOURCES",
        "RESOURCES_SERVER",
        "RESOURCES_SERVER_REF",
        "RESPONSE",
        "RESPONSES_CREATE_PARAMS",
        "REWARD",
        "REWARD_COMPONENTS",
        "ROLE",
        "ROUTED_EXPERTS",
        "ROUTER_FINISH_SESSION",
        "ROUTER_SESSION_HEADER",
        "SAMPLING_SEED",
        "RUN_ROUTE",
        "RunResult",
        "SEED_SESSION_ROUTE",
        "SESSION_ID",
        "SERVER_TYPE",
        "SERVER_TYPES",
        "ServerInstance",
        "TEMPERATURE",
        "TEXT",
        "TOOLS",
        "TOP_P",
        "VERIFY_ROUTE",
        "VerifyAnswer",
        "affinity_key",
        "episode_of",
        "agent_name",
        "build_response",
        "build_run_body",
        "build_verify_body",
        "create_params",
        "decode_run_result",
        "decode_server_instance",
        "decode_verify_result",
        "encode_server_instance",
        "finite_components",
        "finite_reward",
        "input_messages",
        "policy_version_envelope",
        "read_policy_version",
        "resources_server_name",
        "row_tools",
        "sampling_overrides",
        "with_affinity",
        "with_episode",
        "with_seed",
    },
    "nemogym_sdk.grpo": {
        "AdvantageStats",
        "Advantages",
        "Aggregation",
        "Gather",
        "ImportanceSampling",
        "LossType",
        "PolicyLoss",
        "Scaling",
        "compute_advantages",
        "group_advantages",
    },
    "nemogym_sdk.lora": {
        "ENABLE_RUNTIME_LORA",
        "LoraCapabilities",
        "LoraSync",
        "LoraSyncError",
        "LoraSyncHook",
        "SyncRecord",
        "check_served_name",
        "install_lora_sync",
        "probe_lora_support",
    },
    "nemogym_sdk.serve": {
        "BadRequestError",
        "CausalLMBackend",
        "ChatTemplate",
        "Generation",
        "NotFoundError",
        "RunningServer",
        "SamplingRecorder",
        "Script",
        "ScriptRule",
        "ServeEngine",
        "ServeError",
        "ServerThread",
        "TINY_MODEL_NAME",
        "ToolCall",
        "VllmBackend",
        "build_prompt_ids",
        "build_tiny_model",
        "build_tiny_tokenizer",
        "create_app",
        "example_arguments",
        "parse_tool_calls",
        "read_records",
        "save_tiny",
        "splice_prefix",
        "start_server",
        "turn_key",
    },
    "nemogym_sdk.serve.parsers": {
        "OutputParsers",
        "ParsedTurn",
        "REASONING_PARSERS",
        "TOOL_CALL_PARSERS",
    },
    "nemogym_sdk.serve.families": {
        "FAMILIES",
        "Architecture",
        "Family",
        "SpecialToken",
        "Teaching",
        "Vocabulary",
        "build_family_model",
        "build_family_tokenizer",
        "cache_root",
        "family_model_dir",
        "family_named",
        "save_family",
        "taught_model_dir",
    },
    "nemogym_sdk.gym": {
        "BackendProcess",
        "CATALOGUE",
        "DatasetMissingError",
        "ServerDirectoryMissingError",
        "EnvironmentInfo",
        "EnvironmentLocation",
        "EnvironmentSetup",
        "ENV_PATH_ENV_VAR",
        "GYM_VENV_ENV_VAR",
        "GymStack",
        "GymVenv",
        "GymVenvNotFoundError",
        "HEAD_SERVER_NAME",
        "Launch",
        "PolicyModel",
        "ProcessGroup",
        "ProcessSpec",
        "REQUIREMENTS_CACHE_ENV_VAR",
        "RequirementsInstallError",
        "ResolvedEnvironment",
        "SDK_ENVIRONMENTS",
        "SDK_ENVS_DIR",
        "ServerEnvironment",
        "ServerNotReadyError",
        "ServerRequirements",
        "ServerSpec",
        "ServerStartError",
        "StackBuilder",
        "StackConfig",
        "UvNotFoundError",
        "VLLM_VENV_ENV_VAR",
        "VllmVenv",
        "VllmVenvNotFoundError",
        "build_stack_config",
        "default_gym_venv_path",
        "default_requirements_cache",
        "default_vllm_venv_path",
        "describe_environment",
        "environment_path",
        "find_gym_venv",
        "find_uv",
        "find_vllm_venv",
        "free_loopback_ports",
        "locate_environment",
        "prepare_server_environment",
        "read_server_requirements",
        "resolve_environments",
        "start_serve",
        "start_vllm",
        "ROUTER_ENV_VAR",
        "RouterNotFoundError",
        "RouterProcess",
        "SamplerFleet",
        "find_router",
        "start_router",
        "start_samplers",
        "GymLauncher",
    },
    "nemogym_sdk.testing": {
        "BINARY_OR_GRID",
        "BINARY_OR_REWARDS",
        "CHECKS",
        "DRIFT_KINDS",
        "Episode",
        "FAILED_STATUSES",
        "FAILURE_KINDS",
        "FailureCase",
        "FakeAgent",
        "Fault",
        "FaultScript",
        "GRID_REWARDS",
        "JSON_REWARDS",
        "LOGPROBS",
        "Parser",
        "PropertyCheckError",
        "REWARDS",
        "RewardGroups",
        "Sample",
        "TOKENS",
        "always",
        "burst",
        "check_all",
        "check_drift_rejected",
        "check_env_tokens_not_trained",
        "check_failures_not_trained",
        "check_logprob_count_mismatch_not_trained",
        "check_logprobs",
        "check_never_crashes",
        "check_num_turns",
        "check_policy_tokens_trained",
        "check_reward",
        "check_stitching",
        "drifted_episodes",
        "episodes",
        "failures",
        "fake_agent",
        "find_failures",
        "grouped_rollouts",
        "json_values",
        "mangled_responses",
        "raw_responses",
        "reward_groups",
        "rollout_samples",
        "rollouts",
        "scored_rollout",
        "sdk_parser",
        "templated_episodes",
        "seed_dict_samples",
    },
    "nemogym_sdk.adapters.torch": {
        "ImportanceSampling",
        "LossTerms",
        "LossType",
        "PolicyLoss",
        "StepMetrics",
        "all_gather_array",
        "episode_tokens",
        "learner_processing",
        "loss_normalizer",
        "policy_loss",
        "policy_loss_terms",
        "policy_span",
        "token_logprobs",
        "train_step",
    },
    "nemogym_sdk.adapters.trl": {
        "CpuVarlenAttention",
        "LoraSyncCallback",
        "MAX_TRL_EXCLUSIVE",
        "MIN_TRL",
        "NemoGymFeed",
        "NemoGymRolloutFunc",
        "ROW_ID_KEY",
        "TESTED_TRL",
        "TRLVerifyReward",
        "UnsupportedTRLError",
        "check_trl_version",
        "make_dataset",
        "make_rollout_func",
        "make_verify_reward",
        "nemo_gym_reward",
        "prompt_row_id",
        "run_async_grpo_on_cpu",
        "sampling_from_args",
        "to_trl_output",
    },
    "nemogym_sdk.adapters.axolotl": {
        "DatasetSpec",
        "NemoGymPlugin",
        "NemoGymSettings",
        "apply_config_defaults",
        "impute_failed",
        "nemo_gym_env_reward",
        "nemo_gym_verify_reward",
    },
    "nemogym_sdk.rollout_engine": {
        "EngineClosedError",
        "EngineOptions",
        "EngineStalledError",
        "EngineStep",
        "Group",
        "Leftover",
        "RolloutEngine",
        "is_due",
        "keeps_bound",
        "may_start",
    },
    "nemogym_sdk.samplers": {
        "BackendProcess",
        "ROUTER_ENV_VAR",
        "RouterNotFoundError",
        "RouterProcess",
        "SamplerFleet",
        "VLLM_VENV_ENV_VAR",
        "VllmVenv",
        "VllmVenvNotFoundError",
        "default_vllm_venv_path",
        "find_router",
        "find_vllm_venv",
        "finish_sessions",
        "start_proxy",
        "start_router",
        "start_samplers",
        "start_serve",
        "start_vllm",
    },
    "nemogym_sdk.processes": {
        "LOOPBACK",
        "PORT_RANGE",
        "ProcessGroup",
        "ProcessSpec",
        "ServerNotReadyError",
        "ServerProcess",
        "ServerStartError",
        "StopOnExit",
        "default_log_path",
        "free_loopback_ports",
        "group_alive",
        "spawn",
        "start_server",
        "stop_all",
        "stopping_on_error",
        "tail",
        "wait_answering",
        "wait_ready",
    },
    "nemogym_sdk.train": {
        "TrainConfig",
        "build_policy",
        "main",
        "run",
    },
}


@pytest.mark.parametrize("package", sorted(SURFACE))
def test_each_package_exports_exactly_its_surface(package: str) -> None:
    module = importlib.import_module(package)
    exported = set(module.__all__)
    assert len(exported) == len(module.__all__), f"{package}.__all__ repeats a name"
    assert exported == SURFACE[package], (
        f"{package}: added {sorted(exported - SURFACE[package])}, "
        f"dropped {sorted(SURFACE[package] - exported)}"
    )
    for name in exported:
        assert getattr(module, name) is not None, f"{package}.{name}"
