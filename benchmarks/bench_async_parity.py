"""Does asynchronous GRPO learn as well per step as synchronous? Environments x modes x seeds.

Every run is ``nemogym-train`` with the same rows, generations, learning rate, steps and
episode deadline; only the mode (and the seed) changes. Three environments:

- ``target_chars``: the SDK's toy environment as shipped (3 rounds, lowercase scores);
- ``equivalence_rule``: NeMo Gym's shipped ``equivalence_rule`` resources server (played by
  its ``simple_agent``) with its ``lc`` config's ``grading_rule`` set to ``seq_match`` (a
  ``difflib`` similarity to the expected answer, dense) instead of ``exact`` (which a tiny
  model never meets), on rows of ours: "Repeat: <6 letters of abc>". The server's files are
  copied from the NeMo Gym venv into the run's own environment directory (``--env-path``) at
  run time, with the one config value changed;
- ``tails``: ``target_chars`` made slow and faulty, as tools are: every step waits
  ``min(4 s, 0.05 s x Pareto(1.1))`` or, with probability 0.01, stalls 60 s, past the
  deadline (about 3 % of the episodes end as ``timeout`` failures), and 3 % of the
  episodes meet a broken tool (every step answers HTTP 500: the client plays the episode
  again, which costs time); its rows score digits, which a random byte model writes less
  often than letters.

Modes: ``sync``, ``async1`` (``--mode async --max-staleness 1``), ``async2`` (K=2), and any
named with ``--mode-flags NAME='FLAGS'`` (the experiments). Per environment and mode the
report gives the reward per step (mean and spread over seeds), the last-5 mean per seed, steps
per hour, the staleness histogram, the importance weights (mean, the fraction truncated or
masked), the sampler/learner KL, and the share of groups trained with fewer than all their
episodes. A run whose ``metrics.jsonl`` is complete is not played again, so an interrupted
sweep continues where it stopped.

    .venv/bin/python benchmarks/bench_async_parity.py --out runs/parity
    .venv/bin/python benchmarks/bench_async_parity.py --out runs/parity --report-only
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import random
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "nemogym_sdk" / "gym" / "envs" / "target_chars"))
import rules  # noqa: E402  (the toy environment's plain-Python rules)

MODES = {
    "sync": (),
    "async1": ("--mode", "async", "--max-staleness", "1"),
    "async2": ("--mode", "async", "--max-staleness", "2"),
}
TAILS = {"scale_s": 0.05, "alpha": 1.1, "cap_s": 4.0, "stall_p": 0.01, "stall_s": 60.0}
TAILS_ERROR_P = 0.03
DIGITS = "0123456789"
EQUIVALENCE_AGENT = "lc_equivalence_rule_simple_agent"


def _jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def target_chars(root: Path) -> list[str]:
    return ["--train-file", str(_jsonl(root / "target_chars.jsonl", rules.train_rows()))]


def tails(root: Path) -> list[str]:
    latency = {**TAILS, "error_p": TAILS_ERROR_P}
    rows = [
        {**rules.make_row(seed, target_chars=DIGITS), "latency": latency}
        for seed in rules.TRAIN_SEEDS
    ]
    return ["--train-file", str(_jsonl(root / "tails.jsonl", rows))]


def equivalence_rule(root: Path) -> list[str]:
    """NeMo Gym's shipped server on an environment path of the run's own, ``seq_match``."""
    from nemogym_sdk.gym import find_gym_venv

    shipped = find_gym_venv().resources_server_dir("equivalence_rule")
    path = root / "envs" / "resources_servers"  # the config names its data from the root
    env_dir = path / "equivalence_rule"
    if not env_dir.exists():
        ignore = shutil.ignore_patterns("__pycache__", "tests")
        shutil.copytree(shipped, env_dir, ignore=ignore)
        config = env_dir / "configs" / "lc.yaml"
        text = config.read_text()
        assert "grading_rule: exact" in text, "the shipped lc.yaml changed"
        config.write_text(text.replace("grading_rule: exact", "grading_rule: seq_match"))
    draw = random.Random(0)
    rows = []
    for _ in range(64):
        answer = "".join(draw.choice("abc") for _ in range(6))
        rows.append(
            {
                "responses_create_params": {
                    "input": [{"role": "user", "content": f"Repeat: {answer}"}],
                    "max_output_tokens": rules.MAX_OUTPUT_TOKENS,
                },
                "expected_answer": answer,
                "agent_ref": {"type": "responses_api_agents", "name": EQUIVALENCE_AGENT},
            }
        )
    return [
        *("--environments", "equivalence_rule:lc", "--env-path", str(path)),
        *("--train-file", str(_jsonl(root / "equivalence_rule.jsonl", rows))),
    ]


ENVIRONMENTS = {"target_chars": target_chars, "equivalence_rule": equivalence_rule, "tails": tails}


def metrics(out: Path) -> list[dict[str, Any]]:
    path = out / "metrics.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return [json.loads(line) for line in lines if line.strip()]


def play(run: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """One ``nemogym-train`` run (skipped when its metrics are complete); its summary."""
    out: Path = run["out"]
    if len(metrics(out)) < args.steps:
        shutil.rmtree(out, ignore_errors=True)
        argv = [
            sys.executable, "-m", "nemogym_sdk.train", "--out", str(out),
            "--steps", str(args.steps), "--rows-per-step", str(args.rows_per_step),
            "--num-generations", str(args.num_generations), "--lr", str(args.lr),
            "--seed", str(run["seed"]), "--episode-timeout", str(args.episode_timeout),
            "--checkpoint-every", str(args.steps), "--max-failure-rate", "1",
            *run["env_flags"], *run["mode_flags"],
        ]  # fmt: skip
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        began = time.perf_counter()
        done = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True)
        (out / "stderr.log").parent.mkdir(parents=True, exist_ok=True)
        (out / "stderr.log").write_text(done.stderr)
        label = f"{run['environment']}/{run['mode']}/seed{run['seed']}"
        if done.returncode != 0:
            print(f"{label}: FAILED (exit {done.returncode}), see {out}/stderr.log", flush=True)
        else:
            print(f"{label}: {time.perf_counter() - began:.0f} s", flush=True)
    return summarize(run, metrics(out))


def summarize(run: dict[str, Any], steps: list[dict[str, Any]]) -> dict[str, Any]:
    def total(key: str) -> float:
        return float(sum(s.get(key, 0) for s in steps))

    stale: dict[str, int] = {}
    for s in steps:
        for k, v in s.get("staleness", {}).items():
            stale[k] = stale.get(k, 0) + v
    wall = total("step_s")
    rewards = [s["reward_mean"] for s in steps]
    return {
        **{k: run[k] for k in ("environment", "mode", "seed")},
        "steps": len(steps),
        "rewards": rewards,
        "last5": statistics.mean(rewards[-5:]) if rewards else float("nan"),
        "steps_per_hour": 3600 * len(steps) / wall if wall else float("nan"),
        "staleness": stale,
        "is_weight_mean": statistics.mean(s["is_weight_mean"] for s in steps) if steps else 0,
        "is_limited_fraction": (
            statistics.mean(s["is_limited_fraction"] for s in steps) if steps else 0
        ),
        "mismatch_kl": statistics.mean(s["mismatch_kl"] for s in steps) if steps else 0,
        "partial_fraction": total("partial_groups") / total("groups") if steps else 0,
        "failed_fraction": 1 - total("ok") / total("rollouts") if steps else 0,
    }


def _spread(values: list[float]) -> str:
    if len(values) < 2:
        return f"{values[0]:.3f}" if values else "-"
    return f"{statistics.mean(values):.3f} ± {statistics.stdev(values):.3f}"


def report(results: list[dict[str, Any]], modes: list[str]) -> str:
    """The markdown table and the curves (mean over seeds, per step)."""
    lines = [
        "| environment | mode | last-5 reward (mean ± sd over seeds) | per seed | steps/h | "
        "staleness (tokens per versions behind) | IS weight mean | IS truncated/masked | "
        "sampler-learner KL | groups short of episodes | failed episodes |",
        "|---|---|---|---|---:|---|---:|---:|---:|---:|---:|",
    ]
    curves = []
    for environment in dict.fromkeys(r["environment"] for r in results):
        sync_last5 = [
            r["last5"] for r in results if r["environment"] == environment and r["mode"] == "sync"
        ]
        for mode in modes:
            runs = [r for r in results if r["environment"] == environment and r["mode"] == mode]
            if not runs:
                continue
            last5 = [r["last5"] for r in runs]
            stale: dict[str, int] = {}
            for r in runs:
                for k, v in r["staleness"].items():
                    stale[k] = stale.get(k, 0) + v
            verdict = ""
            if mode != "sync" and len(sync_last5) >= 2:
                low, high = min(sync_last5), max(sync_last5)
                inside = low <= statistics.mean(last5) <= high
                verdict = " (within sync's range)" if inside else " (outside sync's range)"
            lines.append(
                f"| {environment} | {mode} | {_spread(last5)}{verdict} | "
                + " ".join(f"{v:.2f}" for v in last5)
                + f" | {statistics.mean(r['steps_per_hour'] for r in runs):.0f} | "
                + json.dumps(dict(sorted(stale.items(), key=lambda kv: int(kv[0]))))
                + f" | {statistics.mean(r['is_weight_mean'] for r in runs):.3f}"
                + f" | {statistics.mean(r['is_limited_fraction'] for r in runs):.4f}"
                + f" | {statistics.mean(r['mismatch_kl'] for r in runs):.2e}"
                + f" | {statistics.mean(r['partial_fraction'] for r in runs):.3f}"
                + f" | {statistics.mean(r['failed_fraction'] for r in runs):.3f} |"
            )
            length = min(len(r["rewards"]) for r in runs)
            per_step = [[r["rewards"][i] for r in runs] for i in range(length)]
            curves.append(
                f"{environment:16} {mode:8} mean "
                + " ".join(f"{statistics.mean(v):.2f}" for v in per_step)
            )
            if len(runs) > 1:
                curves.append(
                    f"{'':16} {'':8} sd   "
                    + " ".join(f"{statistics.stdev(v):.2f}" for v in per_step)
                )
    return "\n".join(lines) + "\n\nreward per step:\n" + "\n".join(curves)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--environments", default=",".join(ENVIRONMENTS))
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--rows-per-step", type=int, default=4)
    parser.add_argument("--num-generations", type=int, default=8)
    parser.add_argument("--lr", type=float, default=0.02)
    parser.add_argument("--episode-timeout", type=float, default=20.0)
    parser.add_argument(
        "--mode-flags",
        action="append",
        default=[],
        metavar="NAME=FLAGS",
        help="a further mode: its name and its nemogym-train flags (an experiment)",
    )
    parser.add_argument("--jobs", type=int, default=1, help="runs at once")
    parser.add_argument("--out", type=Path, default=Path("runs/parity"))
    parser.add_argument("--report-only", action="store_true")
    args = parser.parse_args()
    modes = dict(MODES)
    for entry in args.mode_flags:
        name, _, flags = entry.partition("=")
        modes[name] = tuple(shlex.split(flags))
    wanted = args.modes.split(",")
    unknown = [m for m in wanted if m not in modes]
    if unknown:
        parser.error(f"unknown mode(s) {unknown}; known: {sorted(modes)} (add with --mode-flags)")
    args.out.mkdir(parents=True, exist_ok=True)
    runs = []
    for environment in args.environments.split(","):
        env_flags = ENVIRONMENTS[environment](args.out)
        for mode in wanted:
            for seed in map(int, args.seeds.split(",")):
                runs.append(
                    {
                        "environment": environment,
                        "mode": mode,
                        "seed": seed,
                        "env_flags": env_flags,
                        "mode_flags": modes[mode],
                        "out": args.out / environment / mode / f"seed{seed}",
                    }
                )
    if args.report_only:
        results = [summarize(run, metrics(run["out"])) for run in runs]
    else:
        with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
            results = list(pool.map(lambda run: play(run, args), runs))
    results = [r for r in results if r["steps"]]
    (args.out / "results.json").write_text(json.dumps(results, indent=1))
    print(
        f"{args.steps} steps of {args.rows_per_step} groups x {args.num_generations}, "
        f"lr {args.lr}, episode timeout {args.episode_timeout} s, seeds {args.seeds}"
    )
    print(report(results, wanted))


if __name__ == "__main__":
    main()
