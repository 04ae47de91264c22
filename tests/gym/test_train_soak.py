"""nemogym-train killed with SIGKILL at random moments, ``--resume`` after each, to the end
(issue 29): every step is trained once, every group once, none skipped, in both modes; in
sync mode the final adapter is the one a run without kills ends with.

The runs attach to the worker's toy deployment (``tests/gym/deployment.py``), so a resume
costs the trainer's own start only, and kills land anywhere: during the start, the
rollouts, the learner step, the adapter's publication or a checkpoint write. The suite
kills each mode ``NEMOGYM_SOAK_KILLS`` times (3; docs/faults.md records a run with 20, and
``NEMOGYM_SOAK_STEPS`` steps).
"""

from __future__ import annotations

import json
import os
import random
import time
from pathlib import Path
from typing import Any

import attrs
import pytest

from nemogym_sdk.data import load_rows
from nemogym_sdk.train.config import TrainConfig
from tests.gym.deployment import ToyDeployment
from tests.gym.test_train_faults import children, start, steps_logged, wait_for_steps
from tests.procs import alive, gone_within

pytestmark = [pytest.mark.gym, pytest.mark.slow]

KILLS = int(os.environ.get("NEMOGYM_SOAK_KILLS", "3"))
STEPS = int(os.environ.get("NEMOGYM_SOAK_STEPS", "8"))
ROWS_PER_STEP = 2
MAX_STALENESS = 1
SEED = TrainConfig().seed
FLAGS = (
    *("--rows-per-step", str(ROWS_PER_STEP), "--num-generations", "4"),
    *("--steps", str(STEPS), "--checkpoint-every", "1", "--max-staleness", str(MAX_STALENESS)),
    "--seeded-rollouts",  # a group played again draws its tokens again
)
MODE_FLAGS = {
    "sync": ("--mode", "sync", "--importance-sampling", "none"),
    "async": ("--mode", "async"),
}
"""Sync runs weigh no token by the sampler's logprob: those vary in the last float bits with
what the CPU sampler batches a turn with, which a weight passes on to the gradient, so that
two runs without kills drift apart after some 20 steps (Adam turns a difference in the last
bits of a near-zero gradient into one of the learning rate). Without it two runs of 40 steps
end with the same adapter to the bit, and a resumed one can be held to that."""
ADAPTER = "adapter_model.safetensors"


@attrs.frozen
class Kill:
    """One SIGKILL: seconds after its run started, the steps logged then."""

    after_s: float
    steps: int


def soak(toy: ToyDeployment, out: Path, mode: str, seed: int) -> tuple[list[Kill], str]:
    """Up to ``KILLS`` runs killed at random moments, each resumed, then one to the end: the
    kills and the last run's stderr. A kill lands during the start (one in five), or a
    random fraction of a step after 1 to 3 further steps, while at least two steps are
    left. Every process a killed run started must be gone."""
    rng = random.Random(seed)
    kills: list[Kill] = []
    resume: tuple[str, ...] = ()
    while len(kills) < KILLS and len(steps_logged(out)) <= STEPS - 2:
        trainer = start(out, *toy.flags, *FLAGS, *MODE_FLAGS[mode], *resume)
        began = time.monotonic()
        if rng.random() < 0.2:
            time.sleep(rng.uniform(0.5, 4.0))
        else:
            target = min(STEPS - 1, len(steps_logged(out)) + rng.randint(1, 3))
            wait_for_steps(out, trainer, target)
            time.sleep(rng.uniform(0.0, 1.2))
        assert trainer.poll() is None, trainer.communicate()[1][-3000:]
        started, after = children(trainer.pid), time.monotonic() - began
        trainer.kill()
        trainer.communicate(timeout=60)
        gone_within(lambda s=started: [s[pid] for pid in s if alive(pid)], 15)
        kills.append(Kill(round(after, 2), len(steps_logged(out))))
        resume = ("--resume",) if any((out / "checkpoints").glob("step_*")) else ()
    trainer = start(out, *toy.flags, *FLAGS, *MODE_FLAGS[mode], *resume)
    _, err = trainer.communicate(timeout=600)
    assert trainer.returncode == 0, err[-3000:]
    return kills, err


def trained(out: Path) -> list[list[Any]]:
    """Every step's ``trained_groups``, in step order."""
    return [line["trained_groups"] for line in steps_logged(out)]


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_random_kills_lose_no_step_and_train_no_group_twice(
    mode: str, toy_deployment: ToyDeployment, tmp_path: Path
) -> None:
    """After every kill and resume: each step logged once, in order, with adapter version
    ``step + 1``; each group trained once, ``ROWS_PER_STEP`` a step, on the row its number
    names. Sync trains exactly the groups a run without kills trains, step by step; async
    trains groups in an order its pacing picks (a resumed run's requeued ones first), and
    every group it started is trained, or listed as untrained at the end: none is lost."""
    out = tmp_path / "run"
    kills, _ = soak(toy_deployment, out, mode, seed=29)
    print(f"{mode}: kills {kills}")  # (-s) when they landed
    assert len(kills) >= min(KILLS, 2), kills
    logged = steps_logged(out)
    assert [line["step"] for line in logged] == list(range(STEPS))
    assert [line["adapter_version"] for line in logged] == list(range(1, STEPS + 1))
    # the trainer's rows: the file, shuffled with the run's seed
    rows = [row.row_id for row in load_rows(str(toy_deployment.train_file), seed=SEED)]
    steps = trained(out)
    assert all(len(groups) == ROWS_PER_STEP for groups in steps), steps
    numbers = [number for groups in steps for number, _ in groups]
    assert len(set(numbers)) == len(numbers), steps  # no group trained twice
    for groups in steps:
        for number, row in groups:
            assert row == rows[number % len(rows)], (number, row)
    if mode == "sync":
        assert numbers == list(range(STEPS * ROWS_PER_STEP))
        _check_the_adapter_is_a_run_without_kills(toy_deployment, out, tmp_path / "unkilled")
        return
    summary = json.loads((out / "summary.json").read_text())
    untrained = summary["leftover"]["untrained_groups"]
    started = set(numbers) | set(untrained)
    assert not set(numbers) & set(untrained)
    assert started == set(range(max(started) + 1)), (steps, untrained)  # none skipped
    assert len(untrained) <= (MAX_STALENESS + 1) * ROWS_PER_STEP  # the pacing's bound


def _check_the_adapter_is_a_run_without_kills(
    toy: ToyDeployment, killed: Path, unkilled: Path
) -> None:
    """The same steps, rows and rollout seeds, run without a kill, end with the same adapter
    and log the same rewards: a resume loses nothing of the optimizer or the data, and
    replays what the killed run played. To the bit, as two runs without kills do
    (`MODE_FLAGS`); training moves LoRA's B, which starts at 0, by about 1e-1."""
    from safetensors.numpy import load_file

    trainer = start(unkilled, *toy.flags, *FLAGS, *MODE_FLAGS["sync"])
    _, err = trainer.communicate(timeout=600)
    assert trainer.returncode == 0, err[-3000:]
    rewards = [[line["reward_mean"] for line in steps_logged(out)] for out in (killed, unkilled)]
    assert rewards[0] == rewards[1], rewards
    final = f"checkpoints/step_{STEPS:06d}/{ADAPTER}"
    ours, theirs = load_file(killed / final), load_file(unkilled / final)
    assert ours.keys() == theirs.keys()
    # LoRA's B starts at 0: its weights are what training moved
    moved = max(float(abs(w).max()) for k, w in theirs.items() if "lora_B" in k)
    apart = max(float(abs(ours[k] - theirs[k]).max()) for k in ours)
    print(f"final adapter: {apart:.2e} apart, LoRA's B moved up to {moved:.2f}")
    assert moved > 1e-2 and apart == 0.0, (apart, moved)
