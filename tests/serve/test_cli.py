"""The command line, lazy imports, and the missing-extra error."""

from __future__ import annotations

import importlib.util
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import requests

from nemogym_sdk.serve.__main__ import build_parser, main
from nemogym_sdk.serve._deps import require_serve_deps

REPO = Path(__file__).resolve().parents[2]


def _python(code: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return done.stdout.strip()


def test_importing_serve_and_its_cli_parser_loads_no_torch() -> None:
    """``import nemogym_sdk.serve`` and the CLI parser import neither torch nor transformers."""
    code = (
        "import sys, nemogym_sdk, nemogym_sdk.serve\n"
        "from nemogym_sdk.serve.__main__ import build_parser\n"
        "build_parser().format_help()\n"
        "print(sorted(m for m in ('torch', 'transformers', 'peft') if m in sys.modules))"
    )
    assert _python(code) == "[]"


def test_help_lists_every_flag() -> None:
    """--help documents the flags of the brief."""
    text = build_parser().format_help()
    for flag in (
        "--host",
        "--port",
        "--model",
        "--served-model-name",
        "--mode",
        "--scripted-tool-turns",
        "--seed",
        "--save-tiny",
        "--logprobs-mode",
    ):
        assert flag in text
    defaults = build_parser().parse_args([])
    assert defaults.logprobs_mode == "raw_logprobs"
    processed = build_parser().parse_args(["--logprobs-mode", "processed_logprobs"])
    assert processed.logprobs_mode == "processed_logprobs"
    assert (defaults.host, defaults.port, defaults.mode, defaults.scripted_tool_turns) == (
        "127.0.0.1",
        8000,
        "scripted",
        2,
    )


def test_missing_extra_raises_an_actionable_import_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without transformers the error names it and the pip extra to install."""
    real = importlib.util.find_spec

    def fake(name: str, *args: Any) -> Any:
        return None if name == "transformers" else real(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", fake)
    with pytest.raises(ImportError, match=re.escape("pip install 'nemogym-sdk[serve]'")) as caught:
        require_serve_deps()
    assert "transformers" in str(caught.value)


def test_save_tiny_flag_and_bad_model_path(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--save-tiny writes a loadable directory; a missing --model path exits 2 with a message."""
    pytest.importorskip("transformers")
    assert main(["--save-tiny", str(tmp_path / "tiny")]) == 0
    assert (tmp_path / "tiny" / "tokenizer.json").is_file()
    assert "saved the tiny model" in capsys.readouterr().out
    assert main(["--model", str(tmp_path / "missing")]) == 2
    assert "Model directory not found" in capsys.readouterr().err


@pytest.mark.slow
def test_cli_serves_a_model_directory_and_exits_cleanly_on_sigterm(tmp_path: Path) -> None:
    """The CLI prints one ready line, serves --model under its name, and exits 0 on SIGTERM."""
    pytest.importorskip("transformers")
    from nemogym_sdk.serve.tiny import save_tiny

    model_dir = save_tiny(tmp_path / "model", seed=4)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "nemogym_sdk.serve",
            *("--port", "0", "--model", str(model_dir), "--served-model-name", "cli-model"),
            *("--mode", "sample", "--log-level", "WARNING"),
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # blocks until ready (or exit)
        match = re.search(
            r"ready: model=cli-model mode=sample base_url=(http://127\.0\.0\.1:\d+/v1)", line
        )
        assert match, line  # (stderr is read in `finally`, once the process is stopped)
        base_url = match.group(1)
        body = {
            "model": "cli-model",
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 4,
        }
        answer = requests.post(f"{base_url}/chat/completions", json=body, timeout=60)
        assert answer.status_code == 200 and answer.json()["usage"]["completion_tokens"] <= 4
        began = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        assert time.monotonic() - began < 30
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=30)  # drain and close the pipes


def test_max_num_seqs_takes_a_positive_count_for_the_transformers_backend(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``--max-num-seqs`` caps a batch (default: the backend's 64); 0 is refused by the
    parser, and with ``--backend vllm`` it is a config error (vLLM takes its own)."""
    from nemogym_sdk.serve.backend import DEFAULT_MAX_BATCH

    assert build_parser().parse_args(["--max-num-seqs", "8"]).max_num_seqs == 8
    assert DEFAULT_MAX_BATCH == 64 and "default 64" in build_parser().format_help()
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--max-num-seqs", "0"])
    assert "at least 1, got '0'" in capsys.readouterr().err
    argv = ["--backend", "vllm", "--vllm-url", "http://127.0.0.1:9/v1", "--model", "m"]
    assert main([*argv, "--max-num-seqs", "4"]) == 2
    assert "--max-num-seqs is for --backend transformers" in capsys.readouterr().err
