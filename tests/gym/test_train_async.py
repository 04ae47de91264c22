"""``nemogym-train --mode async`` end to end through real NeMo Gym (the toy environment
``target_chars``, the transformers sampler keeping ``max_staleness + 2`` adapter versions:
the session's ``toy_deployment``, which keeps 4).

The learning bar: the last 5 steps' mean reward beats the first 5's by at least 0.15 (the
synchronous run's is 0.3, ``tests/gym/test_training.py``). An async run's curve depends on how
far the engine plays ahead, which the machine's load decides: runs of the same test gained
0.22 and 0.23 (in the full suite, where 0.3 failed it), 0.39 and 0.72; the first 5 steps'
mean is about 0.11, so 0.15 is still a curve that more than doubles. Stale tokens are corrected
by importance weights, so the sampler-learner mismatch is no longer ~1e-5 (the tokens come
from an older adapter); what must hold is that every token knows its version and none is
more than K versions behind.

The parity guard (issue 30): the same 16 steps played synchronously (seed 0, seeded
rollouts: the same run every time), and async K=1 must gain at least ``PARITY_SHARE`` of what
sync gains from its first 5 steps to its last 5. One seed's two curves differ by as much as
seeds do: ``benchmarks/bench_async_parity.py`` measured sync's last-5 mean at 0.82-1.00 over
seeds 0-2 on ``target_chars`` and async K=1's at 0.87-1.00, and here (the shared toy
deployment) sync ends at 0.99 while five async runs ended at 0.75-0.82, two of them on a
loaded machine: shares of 0.72-0.80. A sixth, in the full suite on a busier machine (every
token one version behind from step 1), took off about three steps after sync did: a gain
of 0.22 against sync's 0.70, a share of 0.32. So the bar is a quarter: an async run that
stopped learning (a gain near 0) fails it, and so does one whose curve trails sync's by
much more than the load explains.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from .deployment import ToyDeployment
from .test_train import metrics, train

pytestmark = [pytest.mark.gym, pytest.mark.slow]

K = 1
STEPS = ("--steps", "16")
"""4 groups x 8 a step (the trainer's defaults), seed 0, the sampler's seeded rollouts."""
PARITY_SHARE = 0.25


def mean_reward(steps: list[dict[str, Any]]) -> float:
    return sum(s["reward_mean"] for s in steps) / len(steps)


@pytest.fixture(scope="module")
def async_run(toy_deployment: ToyDeployment, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """16 steps with ``--mode async --max-staleness K``: its out directory."""
    out = tmp_path_factory.mktemp("async") / "run"
    train(out, *toy_deployment.flags, "--mode", "async", "--max-staleness", str(K), *STEPS)
    return out


def test_async_run_learns_with_bounded_staleness(async_run: Path) -> None:
    """16 steps of 4 groups x 8: learns (the module docstring's bar); every policy token
    reports its adapter version; its staleness is > 0 for most steps and never above K."""
    out = async_run
    steps = metrics(out)
    assert [s["step"] for s in steps] == list(range(16))
    curve = [s["reward_mean"] for s in steps]
    first5, last5 = mean_reward(steps[:5]), mean_reward(steps[-5:])
    print(f"async learning curve: first5 {first5:.3f} last5 {last5:.3f}")
    assert last5 >= first5 + 0.15, curve
    for step in steps:
        assert step["unversioned_tokens"] == 0, step  # every token's version came back
        assert step["staleness_max"] <= K, step
        assert sum(step["staleness"].values()) == step["policy_tokens"] > 0
        assert step["adapter_version"] == step["step"] + 1
        assert step["ok_fraction"] == 1.0 and step["stepped"] == 1.0
    stale_steps = [s["step"] for s in steps if s["staleness"].get(str(K), 0) > 0]
    assert len(stale_steps) >= 8, stale_steps  # the engine really played ahead
    assert steps[0]["staleness"] == {"0": steps[0]["policy_tokens"]}  # nothing is older than v0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["mode"] == "async"
    left = summary["leftover"]
    assert left["cancelled_episodes"] >= 0 and len(left["untrained_groups"]) <= 4 * (K + 1)


def test_async_learns_per_step_as_sync_does(
    async_run: Path, toy_deployment: ToyDeployment, tmp_path: Path
) -> None:
    """The same 16 steps synchronously: async K=1 gains at least ``PARITY_SHARE`` of sync's
    gain, first 5 steps to last 5 (the module docstring says why that share)."""
    out = tmp_path / "sync"
    train(out, *toy_deployment.flags, "--mode", "sync", *STEPS)
    sync, asynchronous = metrics(out), metrics(async_run)
    assert len(sync) == len(asynchronous) == 16
    assert all(s["staleness_max"] == 0 for s in sync)  # the reference is really synchronous
    gains = [mean_reward(run[-5:]) - mean_reward(run[:5]) for run in (sync, asynchronous)]
    print(f"first-5 to last-5 gain: sync {gains[0]:.3f} async K={K} {gains[1]:.3f}")
    assert gains[0] >= 0.3, [s["reward_mean"] for s in sync]
    assert gains[1] >= PARITY_SHARE * gains[0], gains


def test_async_checkpoints_record_untrained_groups_and_resume_plays_them_first(
    toy_deployment: ToyDeployment, tmp_path: Path
) -> None:
    """4 steps with a checkpoint every 2: the checkpoint lists the groups started but not
    trained; --resume to 6 plays those first and appends steps 4 and 5."""
    out = tmp_path / "run"
    flags = (*toy_deployment.flags, "--mode", "async", "--checkpoint-every", "2")
    flags += ("--rows-per-step", "2", "--num-generations", "4")
    train(out, *flags, "--steps", "4")
    state = json.loads((out / "checkpoints" / "step_000004" / "state.json").read_text())
    engine = state["engine"]
    assert engine["next_index"] >= 8  # 4 steps x 2 groups started, and perhaps more
    assert set(engine["requeue"]) <= set(range(engine["next_index"]))
    assert len(engine["requeue"]) == engine["next_index"] - 8  # started ahead, untrained
    train(out, *flags, "--steps", "6", "--resume")
    steps = metrics(out)
    assert [s["step"] for s in steps] == [0, 1, 2, 3, 4, 5]
    summary = json.loads((out / "summary.json").read_text())
    assert len(summary["curve"]) == 6
