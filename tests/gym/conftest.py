"""Fixtures for tests that start real NeMo Gym servers.

The slow fixtures are shared: the model backend for the whole session, and per test
module the stacks it starts (``stack_factory`` stops them when the module ends, so only
one module's NeMo Gym processes run at a time). The backend is
``python -m nemogym_sdk.serve --mode scripted``, or the server at
``$NEMOGYM_TEST_BACKEND_URL`` when that is set (e.g. a real vLLM).

Tests that need NeMo Gym skip, saying so, only when its venv is absent; with
``NEMOGYM_REQUIRE_GYM=1`` (CI) they fail instead.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from nemogym_sdk.gym import (
    CATALOGUE,
    SDK_ENVIRONMENTS,
    GymStack,
    GymVenv,
    GymVenvNotFoundError,
    PolicyModel,
    find_gym_venv,
    start_serve,
)
from nemogym_sdk.gym.resolve import resolve_each
from tests.require import absent

from .deployment import ToyDeployment, sampler_args
from .stacks import READY_TIMEOUT_S, StackFactory

BACKEND_URL_ENV_VAR = "NEMOGYM_TEST_BACKEND_URL"
RESOLVED_UP_FRONT = (
    *CATALOGUE,
    *SDK_ENVIRONMENTS,
    "math_with_judge",
    "gdpval",
    "equivalence_llm_judge",
    "simpleqa",
    "over_refusal_detection",
)
"""Environments the tests start, resolved in one request to the NeMo Gym worker when the
session begins (each stack then finds its configs in the resolver's cache)."""
BACKEND_MODEL_ENV_VAR = "NEMOGYM_TEST_BACKEND_MODEL"


@pytest.fixture(scope="session")
def gym_venv() -> GymVenv:
    """The NeMo Gym venv; skips the test when it is absent (fails under
    ``NEMOGYM_REQUIRE_GYM=1``, as in CI)."""
    try:
        venv = find_gym_venv()
    except GymVenvNotFoundError as exc:
        absent(f"NeMo Gym venv absent, real-server test skipped: {exc}")
    resolve_each(venv, RESOLVED_UP_FRONT)
    return venv


@pytest.fixture(scope="session")
def backend(gym_venv: GymVenv, tmp_path_factory: pytest.TempPathFactory) -> Iterator[PolicyModel]:
    """A scripted OpenAI-compatible backend on loopback, as a ``PolicyModel``."""
    external = os.environ.get(BACKEND_URL_ENV_VAR)
    if external:
        yield PolicyModel(
            base_url=external, model=os.environ.get(BACKEND_MODEL_ENV_VAR, "tiny-scripted")
        )
        return
    log_path = tmp_path_factory.mktemp("backend") / "serve.log"
    with start_serve(
        mode="scripted", logprobs_mode="raw_logprobs", log_path=log_path, fork=True
    ) as served:
        yield served.policy_model()


@pytest.fixture(scope="session")
def toy_deployment(
    gym_venv: GymVenv, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ToyDeployment]:
    """The sampler ``nemogym-train`` would start and ``target_chars`` with its head server,
    once per session, for the trainer runs that attach (``tests/gym/deployment.py``)."""
    root = tmp_path_factory.mktemp("toy-deployment")
    with start_serve(
        mode="sample",
        logprobs_mode="processed_logprobs",
        seed=0,
        extra_args=sampler_args(),
        log_path=root / "serve.log",
        fork=True,
    ) as sampler:
        policy = sampler.policy_model("policy")  # the trainer's adapter name
        stack = GymStack(
            ["target_chars"],
            policy,
            venv=gym_venv,
            head_server=True,
            workdir=root / "gym",
            ready_timeout=READY_TIMEOUT_S,
        )
        with stack:
            env = stack.config.environment("target_chars")
            train_file = env.train_path or env.example_path
            assert train_file is not None
            yield ToyDeployment(sampler, stack, Path(train_file))


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
