"""``math_with_judge`` runs through ``GymStack``, its requirements installed by the stack.

Its resources server imports ``math_verify``, which the NeMo Gym venv lacks: the stack
builds it a venv of its own (cached under a fresh directory here, so the build happens
in every run) and runs the agent and the model server in the NeMo Gym venv. The
shipped config already has ``should_use_judge: false``, so no judge model is involved.
The example rows are played through ``AgentClient`` and scored; a correct and a wrong
boxed answer go through ``Verifier``; a second stack reuses the cached venv; and with
``install_requirements=False`` the start fails the way it did before the stack installed
requirements (``ModuleNotFoundError: math_verify``).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from nemogym_sdk import (
    AgentClient,
    RolloutStatus,
    TaskRow,
    Timeouts,
    Verifier,
    VerifyItem,
)
from nemogym_sdk.gym import GymStack, ServerStartError
from nemogym_sdk.gym.builder import PYCACHE_DIR
from nemogym_sdk.gym.server_envs import STAMP_NAME

from .stacks import StackFactory

pytestmark = pytest.mark.gym

ENVIRONMENT = "math_with_judge"
SERVER = f"resources_servers/{ENVIRONMENT}"


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A requirements cache of this module's own, empty at first."""
    return tmp_path_factory.mktemp("server-envs")


@pytest.fixture(scope="module")
def stack(stack_factory: StackFactory, cache: Path) -> Iterator[GymStack]:
    """math_with_judge, its requirements installed into ``cache`` on start."""
    with stack_factory([ENVIRONMENT], requirements_cache=cache) as started:
        yield started


def test_start_builds_a_venv_for_the_resources_server_only(stack: GymStack, cache: Path) -> None:
    """The resources server got its own venv (built now); agent and model share the gym venv."""
    envs = stack.server_environments
    math = envs[SERVER]
    assert not math.reused and math.root is not None and math.root.parent == cache
    assert (math.root / STAMP_NAME).is_file()
    assert envs["responses_api_agents/simple_agent"].python == stack.venv.python
    assert envs["responses_api_models/vllm_model"].python == stack.venv.python
    assert not list(stack.venv.site_packages.glob("math_verify*")), "gym venv untouched"
    log = stack.log_paths[ENVIRONMENT].read_text()
    assert str(math.python) in log.splitlines()[0]


def test_example_rows_play_and_verify_through_the_sdk(stack: GymStack) -> None:
    """Every example row comes back OK from /run, scored by math-verify (no boxed answer: 0)."""
    examples = stack.example_rows(ENVIRONMENT)
    assert len(examples) == 5
    agent = stack.environment(ENVIRONMENT).agent
    rows = [
        TaskRow(row_id=f"{ENVIRONMENT}:{i}", data={**data, "agent_ref": {"name": agent}})
        for i, data in enumerate(examples)
    ]
    with AgentClient(stack.directory, timeouts=Timeouts(request=300.0)) as client:
        raws = client.run_raw_sync(rows)
    assert len(raws) == len(examples)
    for raw, data in zip(raws, examples, strict=True):
        assert raw.status is RolloutStatus.OK, raw.error
        result = raw.json()
        assert result["expected_answer"] == data["expected_answer"]
        assert result["reward"] == 0.0 and result["library_reward"] == 0.0
        assert result["extracted_answer"] is None, "the scripted answer has no \\boxed{}"


def test_math_verify_scores_boxed_answers(stack: GymStack) -> None:
    """Through Verifier: the expected answer boxed scores 1, another number 0."""
    (resources,) = stack.directory.resources_servers
    row = stack.example_rows(ENVIRONMENT)[0]
    assert row["expected_answer"] == "32"
    items = [
        VerifyItem(resources_server=resources, row=row, completion=f"So \\boxed{{{answer}}}.")
        for answer in ("32", "31")
    ]
    with Verifier(stack.directory) as verifier:
        right, wrong = verifier.verify_sync(items)
    assert right.status is RolloutStatus.OK and right.reward == 1.0, right.error
    assert wrong.status is RolloutStatus.OK and wrong.reward == 0.0, wrong.error


def test_second_start_reuses_the_cached_venv(
    stack: GymStack, stack_factory: StackFactory, cache: Path
) -> None:
    """A new stack with the same cache installs nothing: same venv, stamp untouched. The
    first start left its bytecode under the venv (not beside any source), for this one."""
    first = stack.server_environments[SERVER]
    assert first.root is not None
    stamp = first.root / STAMP_NAME
    mtime = stamp.stat().st_mtime_ns
    stack.stop()
    compiled = first.root / PYCACHE_DIR
    assert list(compiled.glob("**/math_verify/__pycache__/*.pyc")) == []
    assert list(compiled.glob("**/math_verify/*.pyc")), "math_verify's bytecode was not kept"
    assert not list(first.root.glob("lib/*/site-packages/math_verify/__pycache__"))
    with stack_factory([ENVIRONMENT], requirements_cache=cache) as again:
        second = again.server_environments[SERVER]
        assert second.reused and second.python == first.python
        assert stamp.stat().st_mtime_ns == mtime
        assert len([p for p in cache.iterdir() if p.is_dir()]) == 1
        (resources,) = again.directory.resources_servers
        row = again.example_rows(ENVIRONMENT)[0]
        item = VerifyItem(resources_server=resources, row=row, completion="\\boxed{32}")
        with Verifier(again.directory) as verifier:
            (verdict,) = verifier.verify_sync([item])
        assert verdict.reward == 1.0, verdict.error


def test_without_installing_the_server_cannot_import_math_verify(
    stack_factory: StackFactory, cache: Path
) -> None:
    """``install_requirements=False`` runs it in the NeMo Gym venv, which lacks math-verify."""
    stack = stack_factory([ENVIRONMENT], install_requirements=False, requirements_cache=cache)
    with pytest.raises(ServerStartError) as caught:
        stack.start()
    assert caught.value.server == ENVIRONMENT
    assert "math_verify" in caught.value.log_tail
    assert stack.server_environments[SERVER].python == stack.venv.python
