"""The public surface and the layering rules."""

from __future__ import annotations

import ast
import inspect
import subprocess
import sys
from pathlib import Path

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
        extra = _module_level_imports(PACKAGE / f"{name}.py") - allowed
        assert not extra, f"{name}.py imports {sorted(extra)}"


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
    """Issue 9's additions: the parse-options record (eager) and the reward function's
    counters and cache (lazy, with the network layer)."""
    from nemogym_sdk import records, verify

    assert nemogym_sdk.ParseOptions is records.ParseOptions
    assert nemogym_sdk.verify_stats is verify.verify_stats
    assert nemogym_sdk.VerifyStats is verify.VerifyStats
    assert nemogym_sdk.clear_verifier_cache is verify.clear_verifier_cache
    assert "retry_timeouts" in {f.name for f in __import__("attrs").fields(nemogym_sdk.RetryPolicy)}
    assert not nemogym_sdk.RetryPolicy().retry_timeouts
