"""Synchronous against asynchronous GRPO on a heavy-tailed environment, in one run.

Both modes train the same LoRA (same seed, same rows, same loss) with ``nemogym-train`` on
the toy environment ``target_chars`` made slow: each step of every episode waits a
Pareto(alpha) delay (``rules.Latency``) and sometimes stalls, so episode lengths are heavy
tailed, as tools and sandboxes make them. Reported per mode:

- wall-clock to reach the target mean reward (first step whose 3-step moving mean reaches
  it, counting from the first step's start), steps per hour and rollouts per second;
- the sampler's idle fraction: the share of wall time with no episode in flight (async:
  the engine's measure; sync: the share of each step spent outside the rollout phase);
- the reward curve per step, so "learns as well per step" can be checked side by side;
- async only: the staleness histogram and the importance-weight statistics.

    .venv/bin/python benchmarks/bench_async.py --steps 16 --out runs/bench_async
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
RULES = REPO / "nemogym_sdk" / "gym" / "envs" / "target_chars"
sys.path.insert(0, str(RULES))
import rules  # noqa: E402  (the toy environment's plain-Python rules)


def heavy_tailed_rows(path: Path, latency: dict[str, float]) -> Path:
    rows = [{**row, "latency": latency} for row in rules.train_rows()]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def train(mode: str, out: Path, train_file: Path, args: argparse.Namespace) -> float:
    argv = [
        sys.executable, "-m", "nemogym_sdk.train", "--out", str(out), "--mode", mode,
        "--steps", str(args.steps), "--train-file", str(train_file),
        "--episode-timeout", str(args.episode_timeout), "--seed", "0",
        "--checkpoint-every", str(args.steps), "--backend", args.backend,
    ]  # fmt: skip
    if mode == "async":
        argv += ["--max-staleness", str(args.max_staleness)]
    began = time.perf_counter()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    done = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{mode} run failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}")
    return time.perf_counter() - began


def summarize(mode: str, out: Path, target: float) -> dict[str, Any]:
    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    rewards = [s["reward_mean"] for s in steps]
    wall = [s["step_s"] for s in steps]
    elapsed, reached = 0.0, None
    for i, seconds in enumerate(wall):
        elapsed += seconds
        window = rewards[max(0, i - 2) : i + 1]
        if reached is None and len(window) == 3 and statistics.mean(window) >= target:
            reached = (i, elapsed)
    total = sum(wall)
    if mode == "async":
        idle = sum(s["engine_idle_fraction"] * s["step_s"] for s in steps) / total
    else:
        idle = sum(s["step_s"] - s["rollout_s"] for s in steps) / total
    stale: dict[str, int] = {}
    for s in steps:
        for k, v in s["staleness"].items():
            stale[k] = stale.get(k, 0) + v
    return {
        "mode": mode,
        "steps": len(steps),
        "train_s": total,
        "steps_per_hour": 3600 * len(steps) / total,
        "rollouts_per_s": sum(s["rollouts"] for s in steps) / total,
        "timeouts": sum(s["failures"].get("timeout", 0) for s in steps),
        "idle_fraction": idle,
        "reached": reached,
        "rewards": rewards,
        "staleness": stale,
        "is_weight_mean": statistics.mean(s["is_weight_mean"] for s in steps),
        "is_limited_fraction": statistics.mean(s["is_limited_fraction"] for s in steps),
        "mismatch_mean": statistics.mean(s["mismatch_mean"] for s in steps),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--max-staleness", type=int, default=1)
    parser.add_argument("--target", type=float, default=0.8, help="mean reward to reach")
    parser.add_argument("--episode-timeout", type=float, default=10.0)
    parser.add_argument("--scale-s", type=float, default=0.05)
    parser.add_argument("--alpha", type=float, default=1.1)
    parser.add_argument("--cap-s", type=float, default=4.0)
    parser.add_argument("--stall-p", type=float, default=0.003)
    parser.add_argument("--stall-s", type=float, default=60.0)
    parser.add_argument("--backend", choices=("transformers", "vllm"), default="transformers")
    parser.add_argument("--out", type=Path, default=Path("runs/bench_async"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    latency = {
        "scale_s": args.scale_s, "alpha": args.alpha, "cap_s": args.cap_s,
        "stall_p": args.stall_p, "stall_s": args.stall_s,
    }  # fmt: skip
    train_file = heavy_tailed_rows(args.out / "train.jsonl", latency)
    results = []
    for mode in ("sync", "async"):
        run_s = train(mode, args.out / mode, train_file, args)
        results.append({**summarize(mode, args.out / mode, args.target), "run_s": run_s})
    print(
        f"backend {args.backend}, latency {latency}, episode timeout {args.episode_timeout} s, "
        f"target {args.target}, K={args.max_staleness}"
    )
    print(f"{'mode':6} {'steps/h':>8} {'rollouts/s':>10} {'idle':>6} {'timeouts':>8} "
          f"{'to target':>14} {'last5':>6}")  # fmt: skip
    for r in results:
        reached = (
            "never" if r["reached"] is None else f"step {r['reached'][0]}, {r['reached'][1]:.0f}s"
        )
        print(
            f"{r['mode']:6} {r['steps_per_hour']:8.0f} {r['rollouts_per_s']:10.2f} "
            f"{r['idle_fraction']:6.2f} {r['timeouts']:8d} {reached:>14} "
            f"{statistics.mean(r['rewards'][-5:]):6.3f}"
        )
    sync, asyn = results
    print(f"async/sync steps per hour: {asyn['steps_per_hour'] / sync['steps_per_hour']:.2f}x")
    for r in results:
        print(f"{r['mode']:6} reward per step: " + " ".join(f"{v:.2f}" for v in r["rewards"]))
    print(f"async staleness (policy tokens per versions behind): {asyn['staleness']}")
    print(
        f"async IS weight mean {asyn['is_weight_mean']:.3f}, capped/masked fraction "
        f"{asyn['is_limited_fraction']:.4f}, |learner - sampler| mean {asyn['mismatch_mean']:.3f}"
        f" (sync {sync['mismatch_mean']:.2e})"
    )
    (args.out / "results.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
