"""nemogym-train under faults, as a user meets them, through real NeMo Gym: a stop signal,
a sampler that dies, a NeMo Gym server that dies, a run resumed after each. Each run is a
process of its own whose servers are counted before the fault and must all be gone after.

The fault table of ``docs/faults.md`` names these tests."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.gym, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
FLAGS = ("--rows-per-step", "2", "--num-generations", "4", "--checkpoint-every", "100")


def start(out: Path, *flags: str) -> subprocess.Popen[str]:
    argv = [sys.executable, "-m", "nemogym_sdk.train", "--out", str(out), *FLAGS, *flags]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    return subprocess.Popen(
        argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def finish(trainer: subprocess.Popen[str], timeout: float = 300) -> tuple[int, str]:
    """(exit status, stderr) of a trainer that was left to end."""
    _, err = trainer.communicate(timeout=timeout)
    return trainer.returncode, err


def steps_logged(out: Path) -> list[dict[str, Any]]:
    path = out / "metrics.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return [json.loads(line) for line in lines]


def wait_for_steps(out: Path, trainer: subprocess.Popen[str], count: int) -> None:
    deadline = time.monotonic() + 300
    while len(steps_logged(out)) < count:
        assert trainer.poll() is None, trainer.communicate()[1][-3000:]
        assert time.monotonic() < deadline, f"no {count} steps in 300 s"
        time.sleep(0.2)


def children(pid: int) -> dict[int, str]:
    """Every process under ``pid`` (its servers: each leads its own process group), by PID,
    with its command line and working directory."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            parents[int(entry.name)] = int(fields[1])
    found, frontier = {}, [pid]
    while frontier:
        parent = frontier.pop()
        for child, its_parent in parents.items():
            if its_parent == parent and child not in found:
                try:
                    argv = (Path("/proc") / str(child) / "cmdline").read_bytes()
                    cwd = os.readlink(f"/proc/{child}/cwd")
                except OSError:
                    continue
                found[child] = argv.replace(b"\0", b" ").decode() + f" (in {cwd})"
                frontier.append(child)
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def the(processes: dict[int, str], needle: str) -> int:
    (pid,) = [pid for pid, described in processes.items() if needle in described]
    return pid


def assert_stopped_cleanly(processes: dict[int, str], err: str) -> None:
    """No server outlives the trainer; it says what happened in its last line, without a
    traceback or asyncio's noise about destroyed tasks."""
    assert len(processes) >= 4, processes  # the sampler and NeMo Gym's three servers
    deadline = time.monotonic() + 10
    while any(alive(pid) for pid in processes) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [described for pid, described in processes.items() if alive(pid)]
    assert "Traceback" not in err and "Task was destroyed" not in err, err[-3000:]
    assert err.strip().splitlines()[-1].startswith("nemogym-train: "), err[-1000:]


def assert_one_sequence(out: Path, steps: int) -> None:
    """Every step once, in order, and the sampler got adapter version ``step + 1`` at every
    step: the sequence of a run never stopped."""
    logged = steps_logged(out)
    assert [line["step"] for line in logged] == list(range(steps))
    assert [line["adapter_version"] for line in logged] == list(range(1, steps + 1))


def test_sigterm_stops_at_a_step_boundary_and_resume_goes_on(
    gym_venv: object, tmp_path: Path
) -> None:
    """SIGTERM (Slurm, Kubernetes, ``timeout``) after two steps: the trainer stops at a step
    boundary with a checkpoint there, stops every server it started, exits 143 saying
    where the checkpoint is; ``--resume`` goes on from it with the same step numbers and
    adapter versions."""
    out = tmp_path / "run"
    trainer = start(out, "--steps", "50")
    wait_for_steps(out, trainer, 2)
    servers = children(trainer.pid)
    trainer.send_signal(signal.SIGTERM)
    status, err = finish(trainer)
    assert status == 128 + signal.SIGTERM, err[-3000:]
    assert_stopped_cleanly(servers, err)
    done = len(steps_logged(out))
    kept = out / "checkpoints" / f"step_{done:06d}"
    assert done >= 2 and sorted((out / "checkpoints").iterdir()) == [kept]
    assert f"stopped by SIGTERM; checkpoint {kept}: continue with --resume" in err

    status, err = finish(start(out, "--steps", str(done + 2), "--resume"))
    assert status == 0, err[-3000:]
    assert_one_sequence(out, done + 2)
    assert json.loads((out / "summary.json").read_text())["steps"] == done + 2


def test_sigint_stops_cleanly_too(gym_venv: object, tmp_path: Path) -> None:
    """Ctrl-C once the servers are up (the run is playing episodes): the step in play is
    abandoned, nothing is left running, exit 130, a checkpoint at the steps finished."""
    out = tmp_path / "run"
    trainer = start(out, "--steps", "50")
    deadline = time.monotonic() + 300
    while len(children(trainer.pid)) < 5:  # the sampler, a resolver, NeMo Gym's three
        assert trainer.poll() is None and time.monotonic() < deadline
        time.sleep(0.2)
    time.sleep(3)
    servers = children(trainer.pid)
    trainer.send_signal(signal.SIGINT)
    status, err = finish(trainer, timeout=120)
    assert status == 128 + signal.SIGINT, err[-3000:]
    assert_stopped_cleanly(servers, err)
    assert "stopped by SIGINT" in err
    done = len(steps_logged(out))
    kept = sorted(p.name for p in (out / "checkpoints").glob("*")) if done else []
    assert kept == ([f"step_{done:06d}"] if done else []), (done, kept)


def test_a_dead_sampler_stops_the_run_and_resume_starts_a_new_one(
    gym_venv: object, tmp_path: Path
) -> None:
    """The sampler is killed after the first step: the run stops with one line that says so,
    keeps its checkpoint, stops NeMo Gym's servers; ``--resume`` starts a new sampler and
    finishes the run with one sequence of steps and versions."""
    out = tmp_path / "run"
    trainer = start(out, "--steps", "50", "--checkpoint-every", "1")
    wait_for_steps(out, trainer, 1)
    servers = children(trainer.pid)
    os.kill(the(servers, "nemogym_sdk.serve"), signal.SIGKILL)
    status, err = finish(trainer)
    assert status == 1, err[-3000:]
    assert_stopped_cleanly(servers, err)
    last = err.strip().splitlines()[-1]
    assert "does not answer" in last and "continue with --resume" in last, last
    done = len(steps_logged(out))
    assert (out / "checkpoints" / f"step_{done:06d}").is_dir()

    resumed = start(out, "--steps", str(done + 2), "--resume", "--checkpoint-every", "1")
    status, err = finish(resumed)
    assert status == 0, err[-3000:]
    assert_one_sequence(out, done + 2)


@pytest.mark.parametrize("bound", ["0.5", "1"])
def test_a_dead_environment_server_costs_typed_failures_within_the_bound(
    gym_venv: object, tmp_path: Path, bound: str
) -> None:
    """The environment's resources server is killed after the first step: the episodes
    after it fail, typed (NeMo Gym's agent retries the dead server without end, so they
    end at ``--episode-timeout`` as ``timeout`` failures). With ``--max-failure-rate 1``
    the run goes on and counts them per step; with 0.5 it stops at the first step past it,
    with a checkpoint at that step boundary, naming the failures."""
    out = tmp_path / "run"
    trainer = start(out, "--steps", "3", "--max-failure-rate", bound, "--episode-timeout", "10")
    wait_for_steps(out, trainer, 1)
    servers = children(trainer.pid)
    os.kill(the(servers, "envs/target_chars)"), signal.SIGKILL)
    status, err = finish(trainer)
    logged = steps_logged(out)
    assert logged[0]["failures"] == {}
    if bound == "1":
        assert status == 0, err[-3000:]
        assert [line["step"] for line in logged] == [0, 1, 2]
        assert logged[-1]["failures"] == {"timeout": 8} and logged[-1]["ok"] == 0
        return
    assert status == 1, err[-3000:]
    assert_stopped_cleanly(servers, err)
    last = err.strip().splitlines()[-1]
    stopped = re.search(r"RunStoppedError: (\d) of 8 rollouts of step (\d) failed \(timeout", last)
    assert stopped is not None and int(stopped[1]) > 4, last
    step = int(stopped[2])
    assert len(logged) == step and "max_failure_rate=0.5" in last
    assert [p.name for p in (out / "checkpoints").iterdir()] == [f"step_{step:06d}"]
    assert f"step_{step:06d}: continue with --resume" in last
