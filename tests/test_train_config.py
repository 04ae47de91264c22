"""nemogym-train's configuration: file, flags on top, and errors that say how to fix them."""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest

from nemogym_sdk import ConfigError, DriftPolicy
from nemogym_sdk.train.config import TrainConfig, parse_config, resolve_device


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
        (["--model-family", "qwen4"], r"Unknown model family 'qwen4'; known: qwen2\.5, qwen3"),
        (["--model-family", "qwen3", "--model", "."], "both name the model to train"),
        (["--tool-call-parser", "mistral"], "--tool-call-parser 'mistral' is not one"),
        (["--reasoning-parser", "r1"], "--reasoning-parser 'r1' is not one"),
        (["--config", "/nonexistent.yaml"], "does not exist"),
        (["--device", "gpu"], "device must be one of auto, cpu, cuda or cuda:N"),
        (["--device", "cuda:x"], "device must be one of auto, cpu, cuda or cuda:N"),
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


def test_device_defaults_to_auto_and_is_read_from_file_and_flags(tmp_path: Path) -> None:
    config_file = tmp_path / "run.yaml"
    config_file.write_text("device: cpu\n")
    assert TrainConfig().device == "auto"
    assert parse_config(["--config", str(config_file)]).device == "cpu"
    assert parse_config(["--config", str(config_file), "--device", "cuda:1"]).device == "cuda:1"


def test_auto_and_cpu_resolve_to_the_cpu_without_a_gpu() -> None:
    """What every CPU run (make demo, the tests) trains on: unchanged by the device setting."""
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: auto resolves to cuda")
    assert resolve_device(TrainConfig()) == "cpu"
    assert resolve_device(TrainConfig(device="cpu"), local_rank=1, world=2) == "cpu"


@pytest.mark.parametrize("device", ["cuda", "cuda:0"])
def test_cuda_without_cuda_says_what_to_install(device: str) -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(ConfigError, match=f"device '{device}' needs CUDA") as caught:
        resolve_device(TrainConfig(device=device))
    message = str(caught.value)
    assert "or use device cpu" in message
    if torch.version.cuda is None:
        assert "CPU-only build" in message and "pip install torch --index-url" in message


def test_cuda_indices_per_process_and_out_of_range(monkeypatch: pytest.MonkeyPatch) -> None:
    """Unit test of the mapping alone (torch's CUDA queries faked): under torchrun ``cuda`` is
    each process's ``cuda:LOCAL_RANK`` (modulo the GPUs), an explicit index stays, and an
    index past the visible GPUs is an error that names them."""
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert resolve_device(TrainConfig(device="cuda")) == "cuda"
    assert resolve_device(TrainConfig(device="auto"), local_rank=3, world=4) == "cuda:1"
    assert resolve_device(TrainConfig(device="cuda:0"), local_rank=1, world=2) == "cuda:0"
    with pytest.raises(ConfigError, match=r"sees 2 GPU\(s\), cuda:0 to cuda:1"):
        resolve_device(TrainConfig(device="cuda:2"))


def test_the_sampler_reads_turns_with_the_familys_parsers_unless_told_otherwise() -> None:
    """The parsers the sampler is started with: the family's pair, a named one instead,
    ``none`` to turn one off; without a family, hermes tool calls as before."""
    assert parse_config([]).serve_args() == [
        *("--tool-call-parser", "hermes"),
        *("--history", "contiguous"),
    ]
    family = parse_config(["--model-family", "qwen3.5"])
    assert family.serve_args() == [
        *("--tool-call-parser", "qwen3_coder"),
        *("--history", "contiguous"),
        *("--reasoning-parser", "qwen3"),
    ]
    r1 = parse_config(["--model-family", "deepseek-r1", "--tool-call-parser", "hermes"])
    assert r1.serve_args() == [
        *("--tool-call-parser", "hermes"),
        *("--history", "contiguous"),
        *("--reasoning-parser", "deepseek_r1"),
    ]
    off = parse_config(["--model-family", "qwen3", "--reasoning-parser", "none"])
    assert off.output_parsers().reasoning is None and off.output_parsers().tool_calls == "hermes"


def test_a_template_history_starts_the_sampler_so_and_forks_drifted_episodes() -> None:
    """``--history template``: the sampler renders the template afresh, and an episode it
    rewrote parses into traces (on_drift fork); contiguous keeps marking drift; anything else
    is refused before anything starts."""
    template = parse_config(["--history", "template"])
    assert template.serve_args()[2:4] == ["--history", "template"]
    assert template.engine_options().parse.on_drift is DriftPolicy.FORK
    assert parse_config([]).engine_options().parse.on_drift is DriftPolicy.MARK
    with pytest.raises(ConfigError, match="history must be 'contiguous' or 'template', got 'x'"):
        parse_config(["--history", "x"])


def test_async_starts_no_more_episodes_than_the_sampler_decodes_at_once() -> None:
    """Without --max-inflight, the engine's in-flight cap is what the pacing allows, no more
    than the sampler's capacity, and never below one group; --max-inflight wins."""
    config = parse_config(["--mode", "async", "--rows-per-step", "4", "--num-generations", "8"])
    assert config.engine_options().inflight == 2 * 4 * 8  # K=1: two steps of groups
    assert config.engine_options(capacity=16).inflight == 16
    assert config.engine_options(capacity=3).inflight == 8  # one whole group at least
    assert config.engine_options(capacity=1000).inflight == 64
    chosen = parse_config(["--mode", "async", "--max-inflight", "24"])
    assert chosen.engine_options(capacity=16).inflight == 24


def test_the_deprecated_train_config_module_is_an_alias() -> None:
    """``nemogym_sdk.train_config`` (kept for one release) re-exports the settings' names."""
    import nemogym_sdk.train.config
    import nemogym_sdk.train_config

    assert nemogym_sdk.train_config.TrainConfig is nemogym_sdk.train.config.TrainConfig
    assert nemogym_sdk.train_config.parse_config is nemogym_sdk.train.config.parse_config
    assert set(nemogym_sdk.train_config.__all__) == set(nemogym_sdk.train.config.__all__)


def test_help_shows_each_settings_docstring(capsys: pytest.CaptureFixture[str]) -> None:
    """``--help`` gives every flag its field's docstring (the settings page's text) and its
    default, not the default alone."""
    from nemogym_sdk.train.config import field_docs

    docs = field_docs()
    assert set(docs) == {f.name for f in attrs.fields(TrainConfig)}
    with pytest.raises(SystemExit) as exited:
        parse_config(["--help"])
    assert exited.value.code == 0
    shown = " ".join(capsys.readouterr().out.split())
    for name, doc in docs.items():
        first_words = " ".join(doc.replace("``", "").split()[:4])
        assert first_words in shown, (name, first_words)
    assert "(default: 20)" in shown  # steps
    assert "--mode {sync,async}" in shown and "--backend {transformers,vllm}" in shown
    assert "(default: target_chars)" in shown and "(default: ())" not in shown  # a list
    assert "(default: None)" not in shown
    assert "time out at 600 s). (default: 600)" in shown  # episode_timeout, unset
    assert shown.endswith("https://nemogym-sdk.github.io/nemogym_sdk/reference/train-config/")
