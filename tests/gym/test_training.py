"""GRPO through real NeMo Gym learns, in the plain PyTorch loop of ``examples/torch_grpo.py``.

The example (a loop written only from SDK parts: AgentClient -> collate -> grpo ->
adapters.torch.train_step -> LoraSync) runs against the toy environment ``target_chars`` and
``nemogym_sdk.serve`` sampling the current LoRA adapter by its name. (Two ranks against one
process: ``tests/adapters/test_two_ranks.py`` for the learner, ``tests/gym/test_train.py``
for the reference trainer under torchrun.)

The logprob-mismatch bound: sampler and learner are the same fp32 weights and the same
processed distribution; they differ only in how the sums run (the server decodes one token at
a time with a KV cache, the learner runs whole padded sequences), which moves a logprob by
~1e-5 (seen: at most 2.4e-5). 1e-4 leaves 5x room, while a wrong distribution shows at once:
at this learning rate one step moves the policy's logprobs by 0.6-0.9 on average (measured), so
an adapter one version stale would miss the bound by four orders of magnitude.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from tests import warm

pytestmark = [pytest.mark.gym, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "torch_grpo.py"
MISMATCH_MAX = 1e-4
MISMATCH_MEAN = 1e-5


def run_example(argv: list[str], out: Path, timeout: float) -> None:
    """Run the example; on failure show the end of its output and the server logs."""
    done = warm.run(argv, timeout=timeout)
    if done.returncode != 0:
        logs = "\n".join(
            f"--- {p}\n{p.read_text()[-2000:]}" for p in sorted(out.glob("**/*.log"))[:6]
        )
        pytest.fail(
            f"{argv} exited {done.returncode}:\n{done.stdout[-3000:]}\n"
            f"{done.stderr[-3000:]}\n{logs}"
        )


def metrics(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_grpo_through_real_nemo_gym_learns(gym_venv: object, tmp_path: Path) -> None:
    """16 steps of 4 groups x 8 rollouts: the last 5 steps' mean reward beats the first 5's by
    at least 0.3; every step the served adapter version advanced by one, every rollout was OK
    and three turns long, and the sampler-learner mismatch stayed below the bound."""
    out = tmp_path / "run"
    run_example([sys.executable, str(EXAMPLE), "--steps", "16", "--out", str(out)], out, 900)
    steps = metrics(out)
    assert len(steps) == 16
    curve = [s["reward_mean"] for s in steps]
    first5, last5 = sum(curve[:5]) / 5, sum(curve[-5:]) / 5
    print(f"learning curve: first5 {first5:.3f} last5 {last5:.3f}")
    assert last5 >= first5 + 0.3, curve
    for step in steps:
        assert step["served_version"] == step["adapter_version"] == step["step"] + 1
        assert step["ok_fraction"] == 1.0 and step["turns_mean"] == 3.0
        assert step["mismatch_max"] < MISMATCH_MAX, step
        assert step["mismatch_mean"] < MISMATCH_MEAN, step
        assert step["stepped"] == 1.0 and step["tokens"] > 0
    print("mismatch max over steps:", max(s["mismatch_max"] for s in steps))
