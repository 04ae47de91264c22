"""The docs' examples that need real NeMo Gym servers, run as a user runs them.

``examples/docs/quickstart.py`` (the quickstart page) starts its own model server and
``GymStack``; ``examples/docs/remote_gym.py`` (the remote-deployment guide) attaches to a
head-mode stack this module starts, as it would to a deployment on another machine, and
``examples/docs/discover.py`` (the networking page) discovers the same stack. Each
runs as a script of ``.venv``'s interpreter from the repository root, and its printed
rollouts are checked. The quickstart runs in the background while the head-mode stack
starts (both mostly wait for NeMo Gym's servers), which halves the module's wall time.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from nemogym_sdk.gym import (
    GymStack,
    GymVenv,
    GymVenvNotFoundError,
    PolicyModel,
    find_gym_venv,
    start_serve,
)
from tests.require import absent

pytestmark = [pytest.mark.gym, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples" / "docs"
TINY_EOS = "258"  # <|im_end|> of the tiny model's tokenizer
TIMEOUT_S = 300


@pytest.fixture(scope="module")
def gym_venv() -> GymVenv:
    """NeMo Gym's venv; skips when absent (fails under ``NEMOGYM_REQUIRE_GYM=1``)."""
    try:
        return find_gym_venv()
    except GymVenvNotFoundError as exc:
        absent(f"NeMo Gym venv absent, docs example skipped: {exc}")


def start_example(name: str, *args: str) -> subprocess.Popen[str]:
    """``python examples/docs/<name> args...`` from the repository root, output captured."""
    argv = [sys.executable, str(EXAMPLES / name), *args]
    return subprocess.Popen(
        argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def finish(process: subprocess.Popen[str]) -> list[str]:
    """Wait for an example; its stdout lines (its stderr in the message if it failed)."""
    try:
        stdout, stderr = process.communicate(timeout=TIMEOUT_S)
    finally:
        process.kill()  # a no-op once it has exited
    assert process.returncode == 0, f"{process.args} exited {process.returncode}:\n{stderr[-4000:]}"
    return stdout.splitlines()


@pytest.fixture(scope="module")
def quickstart(gym_venv: GymVenv) -> Iterator[subprocess.Popen[str]]:
    """``quickstart.py``, started when the module's first test starts."""
    process = start_example("quickstart.py")
    try:
        yield process
    finally:
        process.kill()
        process.communicate()


@pytest.fixture(scope="module")
def head_stack(
    gym_venv: GymVenv, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[GymStack, PolicyModel]]:
    """``target_chars`` behind NeMo Gym's head server, sampled by the tiny model."""
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    with start_serve(log_path=log) as served:
        policy = served.policy_model()
        with GymStack(
            ["target_chars"],
            policy,
            venv=gym_venv,
            head_server=True,
            workdir=tmp_path_factory.mktemp("stack"),
            ready_timeout=TIMEOUT_S,
        ) as stack:
            yield stack, policy


def test_remote_gym_attaches_through_the_head_server(
    quickstart: subprocess.Popen[str], head_stack: tuple[GymStack, PolicyModel]
) -> None:
    stack, policy = head_stack  # policy: what NeMo Gym's model server asks the sampler for
    assert stack.directory.head_url is not None
    args = [stack.directory.head_url, str(stack.train_paths["target_chars"])]
    args += ["--eos-token-id", TINY_EOS, "--sampler-url", policy.base_url]
    lines = finish(start_example("remote_gym.py", *args, "--adapter-name", policy.model))
    assert lines[0] == "agents: ['target_chars_agent']", lines
    assert lines[1] == "resources servers: ['target_chars']", lines
    assert len(lines) == 2 + 8, lines
    assert all(line.split()[:2] == ["target_chars_agent", "ok"] for line in lines[2:]), lines


def test_discover_reads_the_head_server(head_stack: tuple[GymStack, PolicyModel]) -> None:
    """``discover.py`` (the networking page's discovery block) on the same stack."""
    stack, _ = head_stack
    assert stack.directory.head_url is not None
    lines = finish(start_example("discover.py", stack.directory.head_url))
    assert lines == [
        str(stack.directory.agents),
        str(stack.directory.resources_servers),
        "target_chars",
    ], lines
    assert list(stack.directory.agents) == ["target_chars_agent"], lines


def test_quickstart_plays_two_rows_four_times(quickstart: subprocess.Popen[str]) -> None:
    lines = finish(quickstart)
    assert len(lines) == 8, lines
    for line in lines:
        row, status, turns, reward = line.split()
        assert row.startswith("train.jsonl:") and status == "ok" and turns == "turns=3", line
        assert 0.0 <= float(reward.removeprefix("reward=")) <= 1.0, line
    assert len({line.split()[0] for line in lines}) == 2  # two rows, four rollouts each
