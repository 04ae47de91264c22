"""``--device``: where the transformers backend runs (cpu by default; auto, cuda, cuda:N)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")

import torch

from nemogym_sdk.devices import torch_device as resolve_device
from nemogym_sdk.errors import ConfigError
from nemogym_sdk.serve.__main__ import build_parser, main
from nemogym_sdk.serve.backend import CausalLMBackend
from nemogym_sdk.serve.protocol import RequestSampling
from nemogym_sdk.serve.tiny import save_tiny

REPO = Path(__file__).resolve().parents[2]
NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")


def test_device_flag_is_documented_and_unset_by_default() -> None:
    """--help names it; unset, the transformers backend runs on the CPU (as before the flag)."""
    assert "--device" in build_parser().format_help()
    assert build_parser().parse_args([]).device is None
    assert CausalLMBackend.tiny(0).device == torch.device("cpu")


def test_resolve_device_spellings() -> None:
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert resolve_device("auto").type == expected
    assert resolve_device(" CPU ") == torch.device("cpu")
    with pytest.raises(ConfigError, match="device must be one of auto, cpu, cuda or cuda:N"):
        resolve_device("gpu")


@NO_CUDA
def test_cuda_without_cuda_exits_2_and_says_what_to_install(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["--device", "cuda", "--mode", "sample"]) == 2
    err = capsys.readouterr().err
    assert "device 'cuda' needs CUDA" in err and "or use device cpu" in err
    if torch.version.cuda is None:
        assert "CPU-only build" in err and "pip install torch --index-url" in err
    assert main(["--device", "tpu"]) == 2
    assert "device must be one of" in capsys.readouterr().err


def test_device_is_refused_with_the_vllm_backend(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """vLLM picks its own device: --device there is a mistake, not silently ignored."""
    argv = ["--backend", "vllm", "--vllm-url", "http://127.0.0.1:9/v1", "--model", str(tmp_path)]
    assert main([*argv, "--device", "cpu"]) == 2
    assert "--device is for --backend transformers" in capsys.readouterr().err


@NO_CUDA
def test_cpu_and_auto_sample_exactly_as_the_default_backend(tmp_path: Path) -> None:
    """device cpu (and auto, without a GPU) gives the default backend's tokens and logprobs
    for the same seed, from the in-process tiny model and from a saved directory."""
    params = RequestSampling(max_tokens=10, temperature=1.0, ignore_eos=True)
    default = CausalLMBackend.tiny(3)
    prompt = default.prompt_ids([{"role": "user", "content": "Name a colour."}])
    expected = default.sample(prompt, params, seed=7)
    on_cpu = CausalLMBackend.tiny(3, device="cpu")
    loaded = CausalLMBackend.from_pretrained(save_tiny(tmp_path / "m", seed=3), device="auto")
    assert loaded.device == torch.device("cpu")
    for backend in (on_cpu, loaded):
        got = backend.sample(prompt, params, seed=7)
        assert got.token_ids == expected.token_ids
        assert [t.logprob for t in got.tokens] == pytest.approx(
            [t.logprob for t in expected.tokens], abs=1e-6
        )
        scored = backend.score(prompt, got.token_ids)
        assert [t.logprob for t in scored] == pytest.approx(
            [t.logprob for t in got.tokens], abs=1e-4
        )


@pytest.mark.slow
def test_cli_reports_its_device_in_the_ready_line() -> None:
    """``--device auto`` serves, and the ready line says where the model runs."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "nemogym_sdk.serve", "--port", "0", "--device", "auto"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # blocks until ready (or exit)
        expected = "cuda" if torch.cuda.is_available() else "cpu"
        assert re.search(rf"ready: model=nemogym-tiny .* device={expected}\b", line), line
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=30)
