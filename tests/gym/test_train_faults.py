"""nemogym-train under faults, as a user meets them, through real NeMo Gym: a stop signal,
a sampler that dies, a NeMo Gym server that dies, a run resumed after each. Each run is a
process of its own whose servers are counted before the fault and must all be gone after.
The stops and resumes are one chain (SIGTERM, resume, SIGINT, resume, SIGKILL, resume, the
sampler killed, resume to the end), run once for the module; a test audits each link.

The fault table of ``docs/faults.md`` names these tests."""

from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path
from typing import Any

import attrs
import psutil
import pytest

from tests import warm
from tests.procs import alive, gone_within
from tests.warm import Run

pytestmark = [pytest.mark.gym, pytest.mark.slow]

FLAGS = ("--rows-per-step", "2", "--num-generations", "4", "--checkpoint-every", "100")
DEAD_ENV_FLAGS = ("--episode-timeout", "20")
"""Runs whose environment server dies: its episodes end at the episode timeout. It bounds a
healthy episode too (about 1 s here): 20 s leaves room on a loaded 2-core machine. (10 s
timed out healthy ones while torch threads spun, before ``OMP_WAIT_POLICY=PASSIVE``.)"""


def start(out: Path, *flags: str) -> Run:
    return warm.start(warm.train_argv("--out", str(out), *FLAGS, *flags))


def finish(trainer: Run, timeout: float = 300) -> tuple[int, str]:
    """(exit status, stderr) of a trainer that was left to end."""
    _, err = trainer.communicate(timeout=timeout)
    return trainer.returncode, err


def steps_logged(out: Path) -> list[dict[str, Any]]:
    path = out / "metrics.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return [json.loads(line) for line in lines]


def wait_for_steps(out: Path, trainer: Run, count: int) -> None:
    deadline = time.monotonic() + 300
    while len(steps_logged(out)) < count:
        assert trainer.poll() is None, trainer.communicate()[1][-3000:]
        assert time.monotonic() < deadline, f"no {count} steps in 300 s"
        time.sleep(0.2)


def children(pid: int) -> dict[int, str]:
    """Every process under ``pid`` (its servers: each leads its own process group), by PID,
    with its command line and working directory."""
    found: dict[int, str] = {}
    try:
        descendants = psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return found
    for child in descendants:
        try:
            found[child.pid] = " ".join(child.cmdline()) + f" (in {child.cwd()})"
        except psutil.Error:  # gone (or a zombie) since it was listed
            continue
    return found


def the(processes: dict[int, str], needle: str) -> int:
    (pid,) = [pid for pid, described in processes.items() if needle in described]
    return pid


def the_sampler(processes: dict[int, str], out: Path) -> int:
    """The sampler among ``processes``: the one listening on the port its log last said it
    serves on (forked from the trainer's copy, it bears the trainer's command line)."""
    ready = [
        line
        for line in (out / "logs" / "serve.log").read_text().splitlines()
        if line.startswith("nemogym_sdk.serve ready")
    ][-1]
    found = re.search(r"base_url=http://127\.0\.0\.1:(\d+)/", ready)
    assert found is not None, ready
    port = int(found.group(1))

    def listens(pid: int) -> bool:
        sockets = psutil.Process(pid).net_connections()
        return any(s.status == psutil.CONN_LISTEN and s.laddr.port == port for s in sockets)

    (pid,) = [pid for pid in processes if listens(pid)]
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


@attrs.frozen
class Stop:
    """How one run of the chain ended: its exit status and stderr, the processes it had
    started (counted before the fault), the steps logged and the checkpoints then."""

    status: int
    err: str
    servers: dict[int, str]
    steps: int
    checkpoints: list[str]

    @classmethod
    def of(cls, trainer: Run, servers: dict[int, str], out: Path) -> Stop:
        status, err = finish(trainer)
        kept = sorted(p.name for p in (out / "checkpoints").glob("step_*"))
        return cls(status, err, servers, len(steps_logged(out)), kept)


@attrs.frozen
class Chain:
    """One run stopped four ways, resumed after each, then finished (see ``chain``)."""

    out: Path
    sigterm: Stop
    sigint: Stop
    sigkill: Stop
    sigkill_gone_s: float
    dead_sampler: Stop
    finished: Stop


def kill_into_a_step(out: Path, trainer: Run, steps: int) -> tuple[Stop, float]:
    """SIGKILL ``trainer`` 0.6 s into step ``steps`` (its rollouts in play): how it ended and
    how long until every process it had started was gone (no cooperation from it: its
    watchdog stops them)."""
    wait_for_steps(out, trainer, steps)
    kept = out / "checkpoints" / f"step_{steps:06d}"
    while not kept.exists():  # written just after the step's line: the next step starts
        assert trainer.poll() is None, trainer.communicate()[1][-3000:]
        time.sleep(0.05)
    time.sleep(0.6)
    servers = children(trainer.pid)
    trainer.kill()
    trainer.wait(timeout=30)
    gone_s = gone_within(lambda: [pid for pid in servers if alive(pid)], 30)
    print(f"SIGKILL: {len(servers)} processes gone {gone_s:.1f} s after the kill")  # (-s)
    return Stop.of(trainer, servers, out), gone_s


@pytest.fixture(scope="module")
def chain(gym_venv: object, tmp_path_factory: pytest.TempPathFactory) -> Chain:
    """One run through the faults a user meets, each followed by ``--resume``: SIGTERM after
    two steps; Ctrl-C once the resumed run's servers are up; SIGKILL 0.6 s into the step
    after one more (a checkpoint every step from there); the sampler killed after one more
    step; then two steps more to the end, with the
    environment's resources server killed after the first of them (``--max-failure-rate
    1``: the run goes on)."""
    out = tmp_path_factory.mktemp("chain") / "run"
    trainer = start(out, "--steps", "50")
    wait_for_steps(out, trainer, 2)
    servers = children(trainer.pid)
    trainer.send_signal(signal.SIGTERM)
    sigterm = Stop.of(trainer, servers, out)

    trainer = start(out, "--steps", "50", "--resume")
    deadline = time.monotonic() + 300
    while len(children(trainer.pid)) < 6:  # watchdog, sampler, resolver, NeMo Gym's three
        assert trainer.poll() is None and time.monotonic() < deadline
        time.sleep(0.2)
    time.sleep(3)
    servers = children(trainer.pid)
    trainer.send_signal(signal.SIGINT)
    sigint = Stop.of(trainer, servers, out)

    trainer = start(out, "--steps", "50", "--resume", "--checkpoint-every", "1")
    sigkill, sigkill_gone_s = kill_into_a_step(out, trainer, sigint.steps + 1)

    trainer = start(out, "--steps", "50", "--resume", "--checkpoint-every", "1")
    wait_for_steps(out, trainer, sigkill.steps + 1)
    servers = children(trainer.pid)
    os.kill(the_sampler(servers, out), signal.SIGKILL)
    dead_sampler = Stop.of(trainer, servers, out)

    steps = str(dead_sampler.steps + 2)
    resume = ("--steps", steps, "--resume", "--checkpoint-every", "1", "--max-failure-rate", "1")
    trainer = start(out, *resume, *DEAD_ENV_FLAGS)
    wait_for_steps(out, trainer, dead_sampler.steps + 1)
    servers = children(trainer.pid)
    os.kill(the(servers, "envs/target_chars)"), signal.SIGKILL)
    finished = Stop.of(trainer, servers, out)
    return Chain(out, sigterm, sigint, sigkill, sigkill_gone_s, dead_sampler, finished)


def test_sigterm_stops_at_a_step_boundary_and_resume_goes_on(chain: Chain) -> None:
    """SIGTERM (Slurm, Kubernetes, ``timeout``) after two steps: the trainer stops at a step
    boundary with a checkpoint there, stops every server it started, exits 143 saying
    where the checkpoint is; ``--resume`` goes on from it with the same step numbers and
    adapter versions (the chain's last test checks the whole sequence)."""
    stop = chain.sigterm
    assert stop.status == 128 + signal.SIGTERM, stop.err[-3000:]
    # each phase that takes a while says so (no silent wait before the first step)
    assert "nemogym-train: starting the sampler (nemogym_sdk.serve, model tiny" in stop.err
    assert "nemogym-train: starting NeMo Gym (GymStack): target_chars..." in stop.err
    # the sampler was forked from a copy of the trainer made at its start (its imports not
    # made again: nemogym_sdk.processes.zygote); the copy is among what must be gone
    started = (chain.out / "logs" / "serve.log").read_text().splitlines()[0]
    assert "(forked, torch, transformers, peft, nemogym_sdk.serve.app imported)" in started
    assert_stopped_cleanly(stop.servers, stop.err)
    kept = chain.out / "checkpoints" / f"step_{stop.steps:06d}"
    assert stop.steps >= 2 and stop.checkpoints == [kept.name]
    assert f"stopped by SIGTERM; checkpoint {kept}: continue with --resume" in stop.err


def test_sigint_stops_cleanly_too(chain: Chain) -> None:
    """Ctrl-C once the servers are up (the resumed run is playing episodes): the step in
    play is abandoned, nothing is left running, exit 130, the newest checkpoint at the
    steps finished."""
    stop = chain.sigint
    assert stop.status == 128 + signal.SIGINT, stop.err[-3000:]
    assert_stopped_cleanly(stop.servers, stop.err)
    assert "stopped by SIGINT" in stop.err
    assert stop.steps >= chain.sigterm.steps
    assert stop.checkpoints[-1] == f"step_{stop.steps:06d}", stop


def test_sigkill_leaves_no_process_behind_and_resume_goes_on(chain: Chain) -> None:
    """SIGKILL (a supervisor's grace period ending, the OOM killer) 0.6 s into a step runs
    none of the trainer's handlers; every process it started (the sampler, NeMo Gym's
    servers, its config resolver) is gone within seconds all the same, its watchdog says so
    in one line, and ``--resume`` goes on from the newest checkpoint (the chain's last test
    checks the whole sequence)."""
    stop = chain.sigkill
    assert stop.status == -signal.SIGKILL
    assert len(stop.servers) >= 5, stop.servers  # the watchdog, the sampler, NeMo Gym's three
    assert chain.sigkill_gone_s < 12, chain.sigkill_gone_s  # SIGTERM; SIGKILL after 5 s
    said = [line for line in stop.err.splitlines() if line.startswith("nemogym-sdk watchdog")]
    assert len(said) == 1 and "ended without stopping the servers it started" in said[0], said
    assert stop.steps > chain.sigint.steps
    # the newest checkpoint is the last step logged, or the one before when the kill fell
    # between a step's line and its checkpoint (the resumed run drops that line and redoes it)
    newest = {f"step_{stop.steps:06d}", f"step_{stop.steps - 1:06d}"}
    assert stop.checkpoints[-1] in newest, stop


def test_a_dead_sampler_stops_the_run_and_resume_starts_a_new_one(chain: Chain) -> None:
    """The sampler is killed after a step: the run stops with one line that says so, keeps
    its checkpoint, stops NeMo Gym's servers; ``--resume`` starts a new sampler and
    finishes the run with one sequence of steps and versions across every stop."""
    stop = chain.dead_sampler
    assert stop.status == 1, stop.err[-3000:]
    assert_stopped_cleanly(stop.servers, stop.err)
    last = stop.err.strip().splitlines()[-1]
    assert "does not answer" in last and "continue with --resume" in last, last
    assert stop.steps > chain.sigkill.steps
    assert stop.checkpoints[-1] == f"step_{stop.steps:06d}"
    assert chain.finished.status == 0, chain.finished.err[-3000:]
    assert_one_sequence(chain.out, stop.steps + 2)


def test_a_dead_environment_server_costs_typed_failures_and_the_run_goes_on(
    chain: Chain,
) -> None:
    """The environment's resources server is killed after the chain's last resume played a
    step: the episodes after it fail, typed (NeMo Gym's agent retries the dead server without
    end, so they end at ``--episode-timeout`` as ``timeout`` failures). With
    ``--max-failure-rate 1`` the run goes on to its end and counts them per step."""
    stop = chain.finished
    assert stop.status == 0, stop.err[-3000:]
    assert_stopped_cleanly(stop.servers, stop.err)
    logged = steps_logged(chain.out)
    assert logged[-2]["failures"] == {}
    assert logged[-1]["failures"] == {"timeout": 8} and logged[-1]["ok"] == 0


def test_a_dead_environment_server_past_the_bound_stops_the_run(
    gym_venv: object, tmp_path: Path
) -> None:
    """The same fault under ``--max-failure-rate 0.5``: the run stops at the first step past
    the bound, with a checkpoint at that step boundary, naming the failures."""
    out = tmp_path / "run"
    trainer = start(out, "--steps", "2", "--max-failure-rate", "0.5", *DEAD_ENV_FLAGS)
    wait_for_steps(out, trainer, 1)
    servers = children(trainer.pid)
    os.kill(the(servers, "envs/target_chars)"), signal.SIGKILL)
    status, err = finish(trainer)
    logged = steps_logged(out)
    assert logged[0]["failures"] == {}
    assert status == 1, err[-3000:]
    assert_stopped_cleanly(servers, err)
    last = err.strip().splitlines()[-1]
    stopped = re.search(r"RunStoppedError: (\d) of 8 rollouts of step (\d) failed \(timeout", last)
    assert stopped is not None and int(stopped[1]) > 4, last
    step = int(stopped[2])
    assert len(logged) == step and "max_failure_rate=0.5" in last
    assert [p.name for p in (out / "checkpoints").iterdir()] == [f"step_{step:06d}"]
    assert f"step_{step:06d}: continue with --resume" in last
    # the reasons are where the message says: a line per failed rollout, and the logs
    assert f"reason is in {out / 'failures.jsonl'}" in last and f"{out / 'gym' / 'logs'}/" in last
    failed = [json.loads(line) for line in (out / "failures.jsonl").read_text().splitlines()]
    assert [f["step"] for f in failed] == [step] * int(stopped[1])
    assert all(f["status"] == "timeout" and f["reason"] and f["row_id"] for f in failed), failed
    # the killed server is named: the timeouts alone only say the agent did not answer
    named = re.compile(r"not answering at the step's end: target_chars \(resources_servers ")
    assert named.search(last) and all(named.search(f["reason"]) for f in failed), last


def test_nemo_gyms_own_launcher_runs_the_environments_and_a_killed_trainer_leaves_none_of_it(
    gym_venv: object, tmp_path: Path
) -> None:
    """``--launcher gym``: the environments run under ``gym env start`` (Ray, NeMo Gym's head
    server) and the trainer attaches through it. SIGKILLed 0.6 s into its third step, the
    trainer leaves nothing: its watchdog sends the launcher SIGINT, NeMo Gym's way to stop
    (its log then says it shut its Ray cluster down), and every process of the deployment,
    Ray's included, is gone within seconds."""
    out = tmp_path / "run"
    trainer = start(out, "--steps", "50", "--launcher", "gym", "--checkpoint-every", "1")
    stop, gone_s = kill_into_a_step(out, trainer, 2)
    steps = steps_logged(out)  # 2, or 3 when the kill fell between a line and its checkpoint
    assert [s["adapter_version"] for s in steps] == list(range(1, len(steps) + 1))
    assert len(steps) in (2, 3) and all(s["failures"] == {} and s["rollouts"] == 8 for s in steps)
    assert any("raylet" in described for described in stop.servers.values()), stop.servers
    assert gone_s < 20, gone_s  # SIGINT to the launcher; its group SIGKILLed after 10 s
    log = (out / "gym" / "logs" / "gym.log").read_text()
    assert "Starting `target_chars_agent`" in log and "Shutting down Ray cluster" in log
    said = [line for line in stop.err.splitlines() if line.startswith("nemogym-sdk watchdog")]
    assert len(said) == 1, stop.err[-3000:]
