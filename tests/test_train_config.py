"""nemogym-train's configuration: file, flags on top, and errors that say how to fix them."""

from __future__ import annotations

from pathlib import Path

import pytest

from nemogym_sdk import ConfigError
from nemogym_sdk.train_config import TrainConfig, parse_config


def test_flags_override_the_file(tmp_path: Path) -> None:
    config_file = tmp_path / "run.yaml"
    config_file.write_text("steps: 40\nlr: 0.01\nenvironments: [target_chars]\nprefetch: true\n")
    config = parse_config(["--config", str(config_file), "--steps", "3", "--no-prefetch"])
    assert config.steps == 3 and config.lr == 0.01 and config.prefetch is False
    assert config.environments == ("target_chars",)


def test_flags_alone_and_list_values() -> None:
    config = parse_config(["--environments", "a, b", "--max-completion-length", "64"])
    assert config.environments == ("a", "b") and config.max_completion_length == 64
    assert parse_config([]) == TrainConfig()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--backend", "tpu"], "backend must be one of transformers, vllm"),
        (["--loss", "ppo"], "loss must be one of"),
        (["--steps", "0"], "steps must be >= 1"),
        (["--num-generations", "1"], "num_generations must be >= 2"),
        (["--steps", "ten"], "steps: expected int"),
        (["--model", "/nonexistent/model"], "neither 'tiny' nor a local Hugging Face"),
        (["--config", "/nonexistent.yaml"], "does not exist"),
    ],
)
def test_bad_settings_say_what_is_wrong(argv: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_config(argv)


def test_unknown_keys_in_the_file_are_named(tmp_path: Path) -> None:
    config_file = tmp_path / "run.yaml"
    config_file.write_text("steps: 3\nlearning_rate: 0.1\n")
    with pytest.raises(ConfigError, match=r"unknown setting.*learning_rate"):
        parse_config(["--config", str(config_file)])
