"""Environment servers in a ``GymStack``: NeMo Gym's ``legacy_agent`` relay started without the
Ray cluster it would start by itself, so NeMo Gym's own rollout collection (``gym eval run``,
which posts ``/run`` to an environment server, never to the agent) runs against a stack."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from nemogym_sdk import AgentClient, load_rows
from nemogym_sdk.directory import ENVIRONMENTS
from nemogym_sdk.gym import GymStack

from .stacks import StackFactory, head_url

pytestmark = pytest.mark.gym

ENVIRONMENT = "example_single_tool_call"


@pytest.fixture(scope="module")
def relay_stack(stack_factory: StackFactory) -> Iterator[GymStack]:
    with stack_factory([ENVIRONMENT], head_server=True, environment_servers=True) as stack:
        yield stack


def test_the_relay_is_started_without_ray_and_listed(relay_stack: GymStack) -> None:
    relays = relay_stack.directory.servers(ENVIRONMENTS)
    assert [(s.name, s.implementation) for s in relays] == [
        (f"{ENVIRONMENT}_environment_server", "legacy_agent")
    ]
    log = relay_stack.log_paths[relays[0].name].read_text()
    assert "Uvicorn running on" in log and "Ray" not in log


def test_nemo_gyms_own_collector_runs_against_the_stack(
    relay_stack: GymStack, tmp_path: Path
) -> None:
    """``gym eval run --no-serve`` finds the relay through the head server and writes one
    scored row per rollout; the same rows through the agent (``AgentClient``) score alike."""
    rows = relay_stack.environment(ENVIRONMENT).example_path
    out = tmp_path / "collected.jsonl"
    port = head_url(relay_stack).rsplit(":", 1)[1]
    gym = relay_stack.venv.python.parent / "gym"
    argv = [str(gym), "eval", "run", "--no-serve", "--agent", f"{ENVIRONMENT}_simple_agent"]
    argv += ["--input", str(rows), "--output", str(out), "--limit", "3", "--num-repeats", "2"]
    argv += [f"++head_server.port={port}", "++head_server.host=127.0.0.1"]
    done = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    collected = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(collected) == 6
    assert {r["_ng_environment_server"] for r in collected} == {f"{ENVIRONMENT}_environment_server"}
    assert all(r["response"]["output"] for r in collected)
    with AgentClient(relay_stack.directory) as client:
        ours = client.run_sync(load_rows(rows)[:3], eos_token_id=258, num_generations=2)
    assert sorted(r["reward"] for r in collected) == sorted(float(r.reward) for r in ours)
