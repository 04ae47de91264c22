"""Where one GRPO training step's wall time goes, through real NeMo Gym on this machine.

Runs ``examples/torch_grpo.py`` (one process, the toy environment ``target_chars``, the tiny
model sampled by ``nemogym_sdk.serve``) for ``--steps`` steps and splits each step into:

  rollout wait   AgentClient.run_raw_sync: every /run of the step (NeMo Gym's agent, resources
                 and model servers, and the sampler behind them)
  parse/collate  parse every /run body into a Rollout, collate, group advantages (the SDK)
  learner        train_step: forward and backward passes, then the optimizer step
  adapter sync   LoraSync.sync: save the adapter, load it in place, confirm in /v1/models

Prints the median of each phase over the steps after ``--warmup`` and its share of the step.
The SDK's own share is parse/collate (plus the client's bookkeeping inside rollout wait).

Usage: python benchmarks/bench_train_step.py [--steps 12] [--warmup 2]
                                             [--rows-per-step 4] [--num-generations 8]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PHASES = (
    ("rollout wait", "rollout_s"),
    ("collate", "collate_s"),
    ("learner", "learner_s"),
    ("  forward+backward", "forward_backward_s"),
    ("  optimizer", "optimizer_s"),
    ("adapter sync", "sync_s"),
    ("step", "step_s"),
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=2, help="first steps left out")
    parser.add_argument("--rows-per-step", type=int, default=4)
    parser.add_argument("--num-generations", type=int, default=8)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-train-") as tmp:
        out = Path(tmp) / "run"
        subprocess.run(
            [
                sys.executable,
                str(REPO / "examples" / "torch_grpo.py"),
                *("--steps", str(args.steps), "--out", str(out)),
                *("--rows-per-step", str(args.rows_per_step)),
                *("--num-generations", str(args.num_generations)),
            ],
            cwd=REPO,
            check=True,
            stdout=subprocess.DEVNULL,
        )
        steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    measured = steps[args.warmup :]
    rollouts = args.rows_per_step * args.num_generations
    print(
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}; {len(measured)} steps of {rollouts} rollouts "
        f"(3 model turns each), medians after {args.warmup} warm-up steps"
    )
    step_s = statistics.median(s["step_s"] for s in measured)
    print(f"{'phase':<20}{'median s':>10}{'share':>8}")
    for label, key in PHASES:
        value = statistics.median(s[key] for s in measured)
        print(f"{label:<20}{value:>10.3f}{value / step_s:>8.1%}")
    tokens = statistics.median(s["tokens"] for s in measured)
    print(f"policy tokens per step (median): {tokens:.0f}")
    print(f"reward: first step {steps[0]['reward_mean']:.3f}, last {steps[-1]['reward_mean']:.3f}")


if __name__ == "__main__":
    main()
