"""The plugin's configuration: keys, validation, defaults, and a ``register`` that does no I/O.

These run in the main venv, where axolotl is not installed: the plugin must import,
construct, validate and apply its defaults there.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from nemogym_sdk import ConfigError
from nemogym_sdk.adapters.axolotl import NemoGymPlugin, NemoGymSettings
from nemogym_sdk.adapters.axolotl.settings import HEAD_ENV_VAR, SAMPLER_ENV_VAR
from tests.axolotl.fakes import recorder


def _cfg(**keys: Any) -> dict[str, Any]:
    return {"nemo_gym_datasets": [{"path": "rows.jsonl"}], **keys}


def test_importing_the_adapter_loads_no_framework() -> None:
    """`import nemogym_sdk.adapters.axolotl` and building the plugin import neither axolotl,
    torch nor transformers (axolotl instantiates it by dotted path; tests run without it)."""
    code = (
        "import sys\n"
        "from nemogym_sdk.adapters.axolotl import NemoGymPlugin\n"
        "NemoGymPlugin().apply_config_defaults({})\n"
        "print(sorted(m for m in ('axolotl', 'torch', 'transformers', 'pydantic') "
        "if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_settings_defaults_and_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Unset keys take documented defaults; URLs fall back to the environment variables."""
    monkeypatch.delenv(HEAD_ENV_VAR, raising=False)
    monkeypatch.delenv(SAMPLER_ENV_VAR, raising=False)
    settings = NemoGymSettings.from_cfg(_cfg(seed=7))
    assert settings.head_url == "127.0.0.1:11000"
    assert not settings.multi_turn
    assert settings.adapter_name == "policy"
    assert settings.seed == 7
    assert settings.reward_function == "nemogym_sdk.adapters.axolotl.nemo_gym_verify_reward"
    monkeypatch.setenv(HEAD_ENV_VAR, "http://10.0.0.1:11000")
    monkeypatch.setenv(SAMPLER_ENV_VAR, "http://10.0.0.2:8000")
    settings = NemoGymSettings.from_cfg(_cfg(nemo_gym_multi_turn=True))
    assert (settings.head_url, settings.sampler_url) == (
        "http://10.0.0.1:11000",
        "http://10.0.0.2:8000",
    )
    assert settings.reward_function == "nemogym_sdk.adapters.axolotl.nemo_gym_env_reward"


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        ({"nemo_gym_datasets": None}, "nemo_gym_datasets is required"),
        ({"nemo_gym_datasets": [{"file": "x.jsonl"}]}, "unknown keys"),
        ({"nemo_gym_datasets": [{"path": "x", "max_samples": 0}]}, "max_samples"),
        ({"nemo_gym_multi_turn": "yes"}, "nemo_gym_multi_turn must be true or false"),
        ({"nemo_gym_run_timeout": 0}, "run_timeout must be > 0"),
        ({"nemo_gym_run_timeout": "long"}, "nemo_gym_run_timeout must be a number"),
        ({"nemo_gym_adapter_name": ""}, "nemo_gym_adapter_name"),
        ({"nemo_gym_multi_turn": True}, "needs nemo_gym_sampler_url"),
    ],
)
def test_invalid_settings_name_the_key(
    keys: dict[str, Any], message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each invalid value is a ConfigError naming what to fix (multi-turn without a sampler
    URL would train a policy the sampler never sees)."""
    monkeypatch.delenv(SAMPLER_ENV_VAR, raising=False)
    with pytest.raises(ConfigError, match=message):
        NemoGymSettings.from_cfg(_cfg(**keys))


def test_pydantic_model_runs_the_same_checks() -> None:
    """axolotl validates the merged schema: the plugin's model rejects what from_cfg rejects."""
    from pydantic import ValidationError

    from nemogym_sdk.adapters.axolotl.args import NemoGymArgs

    assert NemoGymArgs.model_validate(_cfg(nemo_gym_run_timeout=5)).nemo_gym_run_timeout == 5
    with pytest.raises(ValidationError, match="run_timeout must be > 0"):
        NemoGymArgs.model_validate(_cfg(nemo_gym_run_timeout=-1))


def test_config_defaults_force_workers_and_select_the_data_producer_trainer() -> None:
    """Workers become 0; agent mode turns on trl.use_data_producer unless the YAML set it;
    the `datasets` block axolotl's schema requires is filled from nemo_gym_datasets."""
    cfg: dict[str, Any] = _cfg(dataloader_num_workers=8, nemo_gym_multi_turn=True)
    NemoGymPlugin().apply_config_defaults(cfg)
    assert cfg["dataloader_num_workers"] == 0
    assert cfg["trl"] == {"use_data_producer": True}
    assert cfg["datasets"] == [{"path": "rows.jsonl", "type": "nemo_gym"}]
    explicit: dict[str, Any] = _cfg(nemo_gym_multi_turn=True, trl={"use_data_producer": False})
    NemoGymPlugin().apply_config_defaults(explicit)
    assert explicit["trl"]["use_data_producer"] is False  # left for post_trainer_create to refuse
    single = SimpleNamespace(dataloader_num_workers=None, trl=None)
    NemoGymPlugin().apply_config_defaults(single)
    assert single.dataloader_num_workers == 0 and single.trl is None


def test_training_args_carry_zero_workers() -> None:
    """get_training_args is merged into the trainer's arguments after axolotl computed its
    own (a config edit alone came too late in axolotl's plugin: W-CFG-3)."""
    assert NemoGymPlugin().get_training_args({"dataloader_num_workers": 4}) == {
        "dataloader_num_workers": 0
    }
    assert NemoGymPlugin().get_input_args() == "nemogym_sdk.adapters.axolotl.args.NemoGymArgs"


def test_register_does_no_io(tmp_path: Path) -> None:
    """register runs on every rank on the raw YAML: it must not read the datasets, ask the
    head server, probe the sampler or start anything (axolotl's did all of that, W-ARCH-3).

    The head and sampler URLs point at a server that records every request: none arrives,
    and a dataset path that does not exist is not an error yet.
    """
    with recorder() as server:
        cfg = _cfg(
            nemo_gym_multi_turn=True,
            nemo_gym_head_url=server.url,
            nemo_gym_sampler_url=server.url,
            nemo_gym_datasets=[{"path": str(tmp_path / "missing.jsonl")}],
        )
        plugin = NemoGymPlugin()
        plugin.register(cfg)
        assert sum(server.paths.values()) == 0
    assert plugin.settings is None and plugin.directory is None
    assert cfg["dataloader_num_workers"] == 0


def test_hooks_that_need_axolotl_name_the_extra() -> None:
    """Without axolotl, load_datasets raises ImportError naming the pip extra."""
    import importlib.util

    if importlib.util.find_spec("axolotl") is not None:
        pytest.skip("axolotl is installed here")
    with pytest.raises(ImportError, match=r"pip install 'nemogym-sdk\[axolotl\]'"):
        NemoGymPlugin().load_datasets(_cfg())
