"""Where a ``nemogym-train`` run's step time went: phase medians from its ``metrics.jsonl``.

Reads the line per step the trainer writes and prints, for the steps after ``--warmup``, the
median seconds of each phase and its share of the median step:

  rollout        AgentClient.run_sync: every /run of the step (NeMo Gym's agent, resources
                 and model servers, and the sampler behind them), each /run body parsed
                 into a Rollout as it arrives, while the others still play
  collate        Rollouts -> Batch, group advantages (the SDK)
  learner        train_step: forward/backward passes and the optimizer step
  sync           LoraSync: save the adapter, load it in place, confirm it in /v1/models

plus the device, the rollouts per step, the reward's first and last step and the largest
sampler-vs-learner logprob mismatch. Standard library only; works on any run (CPU or GPU).

Usage: python benchmarks/phase_breakdown.py RUN_DIR_OR_METRICS_JSONL [--warmup 1]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

PHASES = (
    ("rollout", "rollout_s"),
    ("collate", "collate_s"),
    ("learner", "learner_s"),
    ("sync", "sync_s"),
    ("step", "step_s"),
)
"""(label, metrics key) of each phase, in the order a step runs them."""


def read_steps(path: Path) -> list[dict[str, Any]]:
    """The step records of ``path`` (a run directory or its ``metrics.jsonl``)."""
    metrics = path / "metrics.jsonl" if path.is_dir() else path
    if not metrics.is_file():
        raise SystemExit(f"phase_breakdown: no metrics file at {metrics}")
    steps = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    if not steps:
        raise SystemExit(f"phase_breakdown: {metrics} has no steps yet")
    return steps


def breakdown(steps: Sequence[dict[str, Any]], warmup: int) -> list[tuple[str, float, float]]:
    """(label, median seconds, share of the median step) per phase, over the steps after
    ``warmup`` (all of them when the run is not longer than the warm-up)."""
    measured = list(steps[warmup:]) or list(steps)
    step_s = statistics.median(s["step_s"] for s in measured)
    rows = []
    for label, key in PHASES:
        value = statistics.median(s[key] for s in measured)
        rows.append((label, value, value / step_s if step_s > 0 else 0.0))
    return rows


def report(steps: Sequence[dict[str, Any]], warmup: int) -> str:
    """The printed breakdown."""
    measured = len(steps[warmup:]) or len(steps)
    device = steps[-1].get("device", "cpu (not recorded)")
    lines = [
        f"device {device}; {steps[-1]['rollouts']} rollouts per step; medians of {measured} "
        f"of {len(steps)} steps (first {len(steps) - measured} left out as warm-up)",
        f"{'phase':<16}{'median s':>10}{'share':>8}",
    ]
    lines += [
        f"{label:<16}{value:>10.3f}{share:>8.1%}"
        for label, value, share in breakdown(steps, warmup)
    ]
    lines.append(
        f"reward: first step {steps[0]['reward_mean']:.3f}, last {steps[-1]['reward_mean']:.3f}; "
        f"logprob mismatch max {max(s['mismatch_max'] for s in steps):.2e}"
    )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path, help="the run's out directory, or its metrics.jsonl")
    parser.add_argument("--warmup", type=int, default=1, help="first steps left out (default 1)")
    args = parser.parse_args(argv)
    print(report(read_steps(args.run), max(0, args.warmup)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
