"""Fixtures for tests against real vLLM (``.venv-vllm``, made by ``make vllm-venv``).

``vllm_backend`` is one vLLM server for the whole test session (start-up takes ~20-30 s
and ~2 GiB on a CPU): the SDK's tiny model (``save_tiny``, seed 0) served as
``nemogym-tiny`` from a temporary directory, runtime LoRA enabled (``--max-lora-rank 8
--max-loras 2``), fp32, and ``--enable-scale-out`` (token-in/token-out
``/inference/v1/generate``). Tests skip, saying so, only when the vLLM venv is absent.

Rules for tests that share it:

- Never send base-model (``nemogym-tiny``) and LoRA requests at the same time: vLLM 0.32's
  CPU LoRA ops apply an adapter to base rows batched with LoRA rows. Sequential is fine.
- Unload the adapters a test loads (``unload_adapter``), so ``/v1/models`` lists only the
  base model between tests.

Tests here that start a server of their own run before the first test that uses
``vllm_backend`` (``pytest_collection_modifyitems`` below), so that two vLLM servers never
run at once. At the end of the session the fixture checks that stopping left no process of the
server's group (API server, EngineCore, resource tracker, and a Worker with V1
multiprocessing on) behind: ``stop()`` ends the whole group.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from nemogym_sdk.gym import BackendProcess, VllmVenv, VllmVenvNotFoundError, find_vllm_venv
from nemogym_sdk.processes import group_alive
from nemogym_sdk.samplers.vllm import start_vllm
from tests.require import absent

SERVED_NAME = "nemogym-tiny"
"""The base model's served name on the shared server."""
MODEL_SEED = 0
"""Seed of the tiny model's weights: ``build_tiny_model(MODEL_SEED)`` is the served model."""
VLLM_TEST_ARGS = ("--enable-scale-out",)
"""Extra flags of the shared server."""


_HERE = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Within this directory, run the tests that do not use ``vllm_backend`` first (the
    other directories' tests keep their places), so the shared server starts only after
    any test that starts a vLLM of its own has stopped it."""
    slots = [i for i, item in enumerate(items) if _HERE in item.path.parents]
    ours = [items[i] for i in slots]
    ours.sort(key=lambda item: "vllm_backend" in getattr(item, "fixturenames", ()))
    for slot, item in zip(slots, ours, strict=True):
        items[slot] = item


@pytest.fixture(scope="session")
def vllm_venv() -> VllmVenv:
    """The vLLM venv; skips the test when it is absent."""
    try:
        return find_vllm_venv()
    except VllmVenvNotFoundError as exc:
        absent(f"vLLM venv absent, real-vLLM test skipped (run `make vllm-venv`): {exc}")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model and tokenizer saved to a temporary directory (``save_tiny``)."""
    pytest.importorskip("transformers")
    from nemogym_sdk.serve.tiny import save_tiny

    return save_tiny(tmp_path_factory.mktemp("vllm-model") / "tiny", MODEL_SEED)


@pytest.fixture(scope="session")
def vllm_backend(
    vllm_venv: VllmVenv, tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[BackendProcess]:
    """A real vLLM server on the tiny model for the session (see the module docstring)."""
    log_path = tmp_path_factory.mktemp("vllm-log") / "vllm.log"
    backend = start_vllm(
        tiny_model_dir,
        served_model_name=SERVED_NAME,
        venv=vllm_venv,
        seed=MODEL_SEED,
        extra_args=VLLM_TEST_ARGS,
        log_path=log_path,
        fork=True,  # forked with the worker's other vLLM servers (one at a time)
    )
    try:
        yield backend
    finally:
        pids = group_pids(backend.pid)
        backend.stop(grace=10.0)
    left = [pid for pid in pids if pid_alive(pid)] + group_pids(backend.pid)
    if left or group_alive(backend.pid):
        pytest.fail(f"vLLM left processes of group {backend.pid} behind: {sorted(set(left))}")


def group_pids(pgid: int) -> list[int]:
    """The PIDs of every process in group ``pgid``, as ``ps`` lists them."""
    out = subprocess.run(
        ["ps", "-o", "pid=", "-g", str(pgid)], capture_output=True, text=True, check=False
    ).stdout
    return [int(field) for field in out.split()]


def pid_alive(pid: int) -> bool:
    """Whether ``ps`` still lists ``pid`` (zombies included)."""
    result = subprocess.run(["ps", "-o", "pid=", "-p", str(pid)], capture_output=True, check=False)
    return result.returncode == 0


def unload_adapter(backend: BackendProcess, name: str) -> None:
    """Unload adapter ``name`` from the server (404 = it was not loaded)."""
    response = requests.post(
        f"{backend.base_url}/unload_lora_adapter", json={"lora_name": name}, timeout=30
    )
    assert response.status_code in (200, 404), response.text


def score(
    backend: BackendProcess, model: str, prompt: list[int], completion: list[int]
) -> list[float]:
    """vLLM's logprobs of ``completion`` after ``prompt`` under ``model`` (base or adapter).

    One ``/v1/completions`` request with the whole sequence as a token-id prompt and
    ``prompt_logprobs: 0``, which gives the logprob of every prompt token after the first.
    """
    response = requests.post(
        f"{backend.base_url}/completions",
        json={
            "model": model,
            "prompt": prompt + completion,
            "max_tokens": 1,
            "temperature": 0.0,
            "prompt_logprobs": 0,
        },
        timeout=60,
    )
    assert response.status_code == 200, response.text
    entries = response.json()["choices"][0]["prompt_logprobs"]
    assert len(entries) == len(prompt) + len(completion) and entries[0] is None
    tail = entries[len(prompt) :]
    return [
        float(entry[str(token)]["logprob"]) for entry, token in zip(tail, completion, strict=True)
    ]
