"""Fixtures for tests that start real NeMo Gym servers.

The slow fixtures are shared: the model backend for the whole session, and per test
module the stacks it starts (``stack_factory`` stops them when the module ends, so only
one module's NeMo Gym processes run at a time). The backend is
``python -m nemogym_sdk.serve --mode scripted``, or the server at
``$NEMOGYM_TEST_BACKEND_URL`` when that is set (e.g. a real vLLM).

Tests that need NeMo Gym skip, saying so, only when its venv is absent.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from nemogym_sdk.gym import (
    GymVenv,
    GymVenvNotFoundError,
    PolicyModel,
    find_gym_venv,
    free_loopback_ports,
)

from .stacks import StackFactory

BACKEND_URL_ENV_VAR = "NEMOGYM_TEST_BACKEND_URL"
BACKEND_MODEL_ENV_VAR = "NEMOGYM_TEST_BACKEND_MODEL"


@pytest.fixture(scope="session")
def gym_venv() -> GymVenv:
    """The NeMo Gym venv; skips the test when it is absent."""
    try:
        return find_gym_venv()
    except GymVenvNotFoundError as exc:
        pytest.skip(f"NeMo Gym venv absent, real-server test skipped: {exc}")


@pytest.fixture(scope="session")
def backend(gym_venv: GymVenv, tmp_path_factory: pytest.TempPathFactory) -> Iterator[PolicyModel]:
    """A scripted OpenAI-compatible backend on loopback, as a ``PolicyModel``."""
    external = os.environ.get(BACKEND_URL_ENV_VAR)
    if external:
        yield PolicyModel(
            base_url=external, model=os.environ.get(BACKEND_MODEL_ENV_VAR, "tiny-scripted")
        )
        return
    (port,) = free_loopback_ports(1)
    log_path = tmp_path_factory.mktemp("backend") / "serve.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "nemogym_sdk.serve", "--port", str(port), "--mode", "scripted"],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    base_url = f"http://127.0.0.1:{port}/v1"
    try:
        _wait_backend(proc, base_url, log_path)
        served = requests.get(f"{base_url}/models", timeout=5).json()["data"][0]["id"]
        yield PolicyModel(base_url=base_url, model=served)
    finally:
        _stop_group(proc)


def _wait_backend(proc: subprocess.Popen[bytes], base_url: str, log_path: Path) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"model backend exited:\n{log_path.read_text()[-3000:]}")
        try:
            if requests.get(f"{base_url}/models", timeout=2).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"model backend not ready:\n{log_path.read_text()[-3000:]}")


def _stop_group(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=10)
    except ProcessLookupError:
        pass
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


@pytest.fixture(scope="module")
def stack_factory(
    gym_venv: GymVenv, backend: PolicyModel, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[StackFactory]:
    """Makes stacks against the shared backend; all are stopped when the module ends."""
    factory = StackFactory(gym_venv, backend, tmp_path_factory)
    try:
        yield factory
    finally:
        factory.stop_all()
