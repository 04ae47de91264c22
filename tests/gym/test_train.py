"""nemogym-train (``python -m nemogym_sdk.train``) end to end through real NeMo Gym, as a user
runs it: the transformers backend here; the vLLM backend's run is in ``tests/vllm``.

Runs that look at what the trainer learns, logs and checkpoints attach to the session's toy
deployment (``toy_deployment``: a sampler and ``target_chars`` behind a head server); the
runs that start their own servers are NeMo Gym's launcher here and the fault tests
(``test_train_faults.py``), which watch the trainer start and stop them.

The logprob-mismatch bound is the one ``tests/gym/test_training.py`` justifies (same fp32
weights and processed distribution on both sides; only the summation order differs).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from nemogym_sdk.processes import free_loopback_ports
from nemogym_sdk.train.config import TrainConfig, resolve_device
from tests import warm

from .deployment import ToyDeployment

pytestmark = [pytest.mark.gym, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
MISMATCH_MAX = 1e-4
SMALL = ("--rows-per-step", "2", "--num-generations", "4")
"""A smoke run's steps: 2 groups of 4 rollouts."""
AUTO_DEVICE = resolve_device(TrainConfig())
"""What ``device: auto`` resolves to here: ``cpu`` on the CPU box, ``cuda`` with a GPU."""


def train(out: Path, *flags: str, expect: int = 0) -> subprocess.CompletedProcess[str]:
    done = warm.run(warm.train_argv("--out", str(out), *flags))
    assert done.returncode == expect, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def metrics(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_trainer_runs_checkpoints_and_resumes(
    toy_deployment: ToyDeployment, tmp_path: Path
) -> None:
    """4 steps, then --resume to 6: every step's rollouts are OK and 3 turns long, the adapter
    version advances by one per step, sampler and learner agree to < 1e-4, checkpoints land
    every 2 steps, and the resumed run appends steps 4 and 5 to the same metrics and curve."""
    out = tmp_path / "run"
    attach = (*toy_deployment.flags, *SMALL, "--checkpoint-every", "2")
    done = train(out, *attach, "--steps", "4")
    assert "metrics" in done.stdout and "reward_curve.png" in done.stdout
    head = toy_deployment.stack.directory.head_url
    assert f"nemogym-train: waiting for the head server at {head} (up to 60 s)" in done.stderr
    steps = metrics(out)
    assert [s["step"] for s in steps] == [0, 1, 2, 3]
    for step in steps:
        assert step["adapter_version"] == step["step"] + 1
        assert step["failures"] == {} and step["rollouts"] == 8 and step["turns_mean"] == 3.0
        assert step["mismatch_max"] < MISMATCH_MAX, step
        assert step["policy_tokens"] > 0 and step["env_tokens"] > 0
        assert step["device"] == AUTO_DEVICE
        assert min(step[k] for k in ("rollout_s", "learner_s", "sync_s")) > 0
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == [
        "step_000002",
        "step_000004",
    ]
    assert (out / "reward_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    breakdown = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "phase_breakdown.py"), str(out)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert f"device {AUTO_DEVICE}; 8 rollouts per step; medians of 3 of 4 steps" in breakdown
    for phase in ("rollout", "collate", "learner", "sync"):
        assert re.search(rf"^{re.escape(phase)} +\d+\.\d{{3}} +\d+\.\d%$", breakdown, re.M)

    train(out, *attach, "--steps", "6", "--resume")
    resumed = metrics(out)
    assert [s["step"] for s in resumed] == [0, 1, 2, 3, 4, 5]
    # the new process publishes the checkpoint's adapter as the version it had (4), then
    # one per step: the sampler sees the sequence of a run that never stopped
    assert [s["adapter_version"] for s in resumed] == [1, 2, 3, 4, 5, 6]
    assert all(s["mismatch_max"] < MISMATCH_MAX for s in resumed[4:])
    summary = json.loads((out / "summary.json").read_text())
    assert summary["curve"] == [s["reward_mean"] for s in resumed]
    assert summary["checkpoint"].endswith("step_000006")


def test_prefetch_plays_the_next_step_during_training(
    toy_deployment: ToyDeployment, tmp_path: Path
) -> None:
    """With --prefetch the next step's rollouts are asked for while this step trains, so they
    sample the adapter one version behind, unless the publish overtakes them (a loaded
    machine); each step's mismatch is what its tokens' recorded versions say: ~1e-5 where
    every token came from the learner's version, the policy's one-step change where some
    did not."""
    out = tmp_path / "run"
    train(out, *toy_deployment.flags, *SMALL, "--steps", "4", "--prefetch")
    steps = metrics(out)
    assert [s["adapter_version"] for s in steps] == [1, 2, 3, 4]
    assert all(s["failures"] == {} for s in steps)
    assert steps[0]["staleness_max"] == 0  # step 0 was sampled by version 0 itself
    for step in steps:
        stale = step["staleness_max"] > 0
        assert (step["mismatch_max"] > MISMATCH_MAX) is stale, step
    assert any(s["staleness_max"] == 1 for s in steps[1:]), steps  # prefetched, one behind


def torchrun(out: Path, *flags: str) -> None:
    """``torchrun --nproc_per_node=2 -m nemogym_sdk.train``, which must exit 0 (torchrun
    forked; its ranks are new interpreters, as torchrun starts them)."""
    (port,) = free_loopback_ports(1)
    argv = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2"]
    argv += ["--master_port", str(port), "-m", "nemogym_sdk.train", "--out", str(out), *flags]
    done = warm.run(argv)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def test_two_ranks_share_the_groups_and_rank_0_syncs(
    toy_deployment: ToyDeployment, tmp_path: Path
) -> None:
    """torchrun with 2 processes: each plays one of the 2 groups, the metrics count both
    ranks' 8 rollouts, and the one adapter rank 0 publishes advances every step."""
    out = tmp_path / "run"
    torchrun(out, *toy_deployment.flags, *SMALL, "--steps", "2")
    steps = metrics(out)
    assert [(s["rollouts"], s["adapter_version"]) for s in steps] == [(8, 1), (8, 2)]
    assert all(s["mismatch_max"] < MISMATCH_MAX and s["failures"] == {} for s in steps)


def test_a_sharded_two_rank_run_resumes_in_one_process(
    toy_deployment: ToyDeployment, tmp_path: Path
) -> None:
    """torchrun with 2 processes and ``--fsdp`` (the policy sharded over both, gloo): the
    adapter each step publishes is gathered in full (the mismatch stays at the fp32 bound);
    its checkpoint holds the full adapter and optimizer state, so one process without
    sharding resumes it and continues the step numbering and the adapter versions (its new
    sampler gets the checkpoint's adapter as version 2)."""
    out = tmp_path / "run"
    torchrun(out, *toy_deployment.flags, *SMALL, "--steps", "2", "--fsdp")
    train(out, *toy_deployment.flags, *SMALL, "--steps", "3", "--resume")
    steps = metrics(out)
    assert [(s["step"], s["adapter_version"]) for s in steps] == [(0, 1), (1, 2), (2, 3)]
    assert all(s["mismatch_max"] < MISMATCH_MAX and s["failures"] == {} for s in steps)


def test_an_async_two_rank_run_learns_what_one_rank_does_from_the_same_groups(
    toy_deployment: ToyDeployment, tmp_path: Path
) -> None:
    """``--mode async`` under torchrun: rank 0 plays and paces, each rank trains its share of
    every step's groups, rank 0 publishes. With ``--max-staleness 0`` the schedule, and with
    seeded rollouts every token, is the one a single process plays, so the two runs train
    the same groups on the same tokens: equal rewards, groups and adapter versions per step,
    and a final adapter equal up to the order the ranks' gradients are summed in (Adam
    divides by each weight's gradient RMS, so that float noise shows at ~1e-5 in weights
    that training moved by ~1e-1; measured 1.7e-5 after 3 steps)."""
    from safetensors.numpy import load_file

    flags = (*toy_deployment.flags, *SMALL, "--steps", "3", "--checkpoint-every", "3")
    flags += ("--mode", "async", "--max-staleness", "0", "--seeded-rollouts")
    flags += ("--importance-sampling", "none")  # no sampler-logprob noise in the gradient
    two, one = tmp_path / "two", tmp_path / "one"
    torchrun(two, *flags)
    train(one, *flags)
    logged = [metrics(two), metrics(one)]
    for key in ("trained_groups", "reward_mean", "adapter_version", "rollouts"):
        assert [s[key] for s in logged[0]] == [s[key] for s in logged[1]], key
    adapter = "checkpoints/step_000003/adapter_model.safetensors"
    ours, theirs = load_file(two / adapter), load_file(one / adapter)
    moved = max(float(abs(w).max()) for k, w in theirs.items() if "lora_B" in k)
    apart = max(float(abs(ours[k] - theirs[k]).max()) for k in ours)
    print(f"two ranks against one: {apart:.2e} apart, LoRA's B moved up to {moved:.2f}")
    assert moved > 1e-2 and apart < 1e-3, (apart, moved)


def test_config_errors_say_how_to_fix_them(
    gym_venv: object, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Unknown environment, unreachable backend, a context too small, a head server without
    training rows: exit 2 with the fix, before any server started or was waited for (no
    sampler log, no NeMo Gym directory). ``main`` runs in this process (the command line's
    own path, ``python -m``, is every other test's)."""
    from nemogym_sdk.train import main

    out = tmp_path / "run"

    def refused(*flags: str) -> str:
        assert main(["--out", str(out), *flags]) == 2
        return capsys.readouterr().err

    assert "unknown NeMo Gym environment 'no_such_env'" in refused("--environments", "no_such_env")
    err = refused("--backend-url", "http://127.0.0.1:9")
    assert "not reachable" in err and "start the sampler" in err
    err = refused("--max-model-len", "40")
    assert "exceeds max_model_len=40" in err and "raise max_model_len" in err
    began = time.monotonic()  # a head server that is not there is not waited for (60 s)
    err = refused("--head-url", "http://127.0.0.1:9")
    assert "head_url needs train_file" in err and time.monotonic() - began < 30
    assert not (out / "logs" / "serve.log").exists() and not (out / "gym").exists()
