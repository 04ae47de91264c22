"""NeMo Gym's own rollout collection vs the SDK's, on one local NeMo Gym stack, in one run.

Starts an instant model stand-in (``model_standin.py``, its own process, next to no CPU) and a
real NeMo Gym stack for ``example_single_tool_call`` (``GymStack``: ``vllm_model`` in training
mode, the resources server, ``simple_agent``, the ``legacy_agent`` environment server, the head
server). Every rollout is one episode of two model calls: a ``get_weather`` tool call, the tool,
then a text answer; the stand-in's prompts extend the token history, so every rollout parses OK.

Variants, each its own process, alternated across repeats:

  (A) ``nemo_gym``: ``ng_collector.py`` with NeMo Gym's interpreter:
      ``RolloutCollectionHelper.preprocess_examples`` + its dispatcher under an
      ``asyncio.Semaphore(C)`` (posting ``/run`` to the environment server it finds through
      the head server), results to a JSONL; then, in this process, every line parsed with
      ``parse_agent_response`` (the line's bytes: ``response`` and ``reward``, tagged with the
      line's task and rollout index) and ``collate``-d. Time = collection + parse.
  (B) ``sdk``: ``sdk_collector.py`` with the SDK's interpreter: ``ServerDirectory.from_head``,
      ``AgentClient(directory, max_concurrency=C).run_sync(rows, num_generations=K)``,
      ``collate``. It posts ``/run`` to the agent itself.
  (B') ``sdk_relay`` (unless ``--no-relay-variant``): (B) posting to the environment server,
      as (A) does, to separate the relay's extra hop from the client's own cost.

Reported per variant and concurrency (median of ``--repeats``): rollouts/s over collection
(+ parse for A) and over the whole process (interpreter start and imports included, + parse
for A); p50 / p99 per-rollout latency (send to receive: from the moment the rollout holds its
concurrency slot and posts ``/run`` until its answer is read; NeMo Gym's own
``rollout_latency_ms`` for A, the same span timed around the client's send for B); the
collector process's peak RSS (``VmHWM``) and CPU per rollout; the CPU share (% of one core)
of each stack process over the collection window. Then one small run per side with a row
whose episode fails (the stand-in answers that row's model call with HTTP 400), to show what
each side returns.

Usage: .venv/bin/python benchmarks/bench_collect.py [--rollouts 512] [--concurrency 16 64 256]
                                                    [--repeats 3] [--num-repeats 8]
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from local_servers import start_script
from model_standin import FAIL_MARKER

from nemogym_sdk import collate, parse_agent_response
from nemogym_sdk.gym import GymStack, PolicyModel

HERE = Path(__file__).resolve().parent
ENVIRONMENT = "example_single_tool_call"
MODEL = "bench-model"
EOS = 2
PAD = 0
NG, SDK, SDK_RELAY = "nemo_gym", "sdk", "sdk_relay"
TICK = os.sysconf("SC_CLK_TCK")
_TASK = re.compile(rb'"_ng_task_index":(\d+)')
_REPEAT = re.compile(rb'"_ng_rollout_index":(\d+)')
_FAILURE_CLASS = re.compile(rb'"_ng_failure_class":"([^"]*)"')


# --- processes ------------------------------------------------------------------------------


def stand_in(*flags: str) -> Any:
    """Start the model stand-in; yield ``(base_url, pid)``; stop it by its PID."""
    return start_script(HERE / "model_standin.py", *flags)


def cpu_seconds(groups: dict[str, int], pids: dict[str, int]) -> dict[str, float]:
    """CPU seconds used so far: per process group (all its processes) and per single pid."""
    ticks = dict.fromkeys([*groups, *pids], 0)
    group_of = {pgid: name for name, pgid in groups.items()}
    pid_of = {pid: name for name, pid in pids.items()}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry.name}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        used = int(fields[11]) + int(fields[12])
        name = group_of.get(int(fields[2])) or pid_of.get(int(entry.name))
        if name is not None:
            ticks[name] += used
    return {name: t / TICK for name, t in ticks.items()}


def machine_ticks() -> tuple[int, int, int]:
    """(busy, steal, all) clock ticks of every CPU so far (``/proc/stat``)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    steal = fields[7] if len(fields) > 7 else 0
    total = sum(fields[:8])
    return total - idle - steal, steal, total


def run_child(argv: list[str], log: Path, groups: dict[str, int], pids: dict[str, int]) -> dict:
    """Run one collector process; its exit code, whole-process wall time, and the CPU
    seconds of the stack's processes between its ``BENCH_START`` and ``BENCH_END``."""
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", PYTHONUNBUFFERED="1")
    began = time.perf_counter()
    with log.open("w") as errors:
        process = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=errors, text=True, env=env, cwd=log.parent
        )
        assert process.stdout is not None
        cpu0 = cpu1 = None
        t0 = t1 = 0.0
        m0 = m1 = (0, 0, 0)
        for line in process.stdout:
            if line.startswith("BENCH_START"):
                cpu0, t0, m0 = cpu_seconds(groups, pids), time.perf_counter(), machine_ticks()
            elif line.startswith("BENCH_END"):
                cpu1, t1, m1 = cpu_seconds(groups, pids), time.perf_counter(), machine_ticks()
            else:
                errors.write(line)
        code = process.wait()
    wall = time.perf_counter() - began
    shares = (
        {name: (cpu1[name] - cpu0[name]) / (t1 - t0) for name in cpu0}
        if cpu0 is not None and cpu1 is not None and t1 > t0
        else {}
    )
    span = max(m1[2] - m0[2], 1)
    machine = {"busy": (m1[0] - m0[0]) / span, "steal": (m1[1] - m0[1]) / span}
    return {"code": code, "wall_s": wall, "server_cpu_share": shares, "machine": machine}


# --- rows -----------------------------------------------------------------------------------


def make_rows(examples: list[dict], count: int, agent: str, fail_at: int | None = None) -> list:
    """``count`` distinct rows (NeMo Gym dedups tasks by their text), cycling over the
    environment's examples, each with its ``agent_ref``; row ``fail_at`` makes its episode
    fail (its user message carries the stand-in's failure marker)."""
    rows = []
    for i in range(count):
        row = copy.deepcopy(examples[i % len(examples)])
        for message in row["responses_create_params"]["input"]:
            if message.get("role") == "user":
                message["content"] = f"{message['content']} (task {i})"
                if i == fail_at:
                    message["content"] += f" {FAIL_MARKER}"
        row["agent_ref"] = {"type": "responses_api_agents", "name": agent}
        rows.append(row)
    return rows


def write_rows(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


# --- one measurement ------------------------------------------------------------------------


class Bench:
    def __init__(self, args: argparse.Namespace, stack: GymStack, standin_pid: int) -> None:
        self.args = args
        self.workdir = Path(args.workdir)
        head = stack.directory.head_url
        assert head is not None
        self.head_url = head
        self.head = head.removeprefix("http://")
        self.gym_python = str(stack.venv.python)
        self.agent = stack.environment(ENVIRONMENT).agent or ""
        self.examples = stack.example_rows(ENVIRONMENT)
        short = {
            f"{ENVIRONMENT}_environment_server": "relay",
            self.agent: "agent",
            "policy_model": "model",
            ENVIRONMENT: "resources",
            "head_server": "head",
        }
        self.groups = {short.get(name, name): pgid for name, pgid in stack.pids.items()}
        self.pids = {"standin": standin_pid}
        self.counter = 0

    def rows_file(self, rows: int, fail_at: int | None = None) -> Path:
        name = f"rows_{rows}{'' if fail_at is None else f'_fail{fail_at}'}.jsonl"
        path = self.workdir / name
        if not path.exists():
            write_rows(path, make_rows(self.examples, rows, self.agent, fail_at))
        return path

    def run(
        self,
        variant: str,
        rows: Path,
        num_repeats: int,
        concurrency: int,
        *,
        sidecar: bool = False,
        keep_output: bool = False,
    ) -> dict[str, Any]:
        self.counter += 1
        tag = f"{self.counter:03d}_{variant}_c{concurrency}"
        stats_path = self.workdir / f"{tag}.stats.json"
        common = ["--input", str(rows), "--stats", str(stats_path)]
        common += ["--num-repeats", str(num_repeats), "--concurrency", str(concurrency)]
        if variant == NG:
            out = self.workdir / f"{tag}.jsonl"
            argv = [self.gym_python, str(HERE / "ng_collector.py"), "--head", self.head]
            argv += ["--output", str(out), *common]
            if sidecar:
                argv.append("--route-failures-to-sidecar")
        else:
            argv = [sys.executable, str(HERE / "sdk_collector.py"), "--head", self.head_url]
            argv += common + (["--via-relay"] if variant == SDK_RELAY else [])
        proc = run_child(argv, self.workdir / f"{tag}.log", self.groups, self.pids)
        stats = json.loads(stats_path.read_text()) if stats_path.exists() else {}
        result: dict[str, Any] = {**stats, **proc, "variant": variant, "log": f"{tag}.log"}
        result.setdefault("collect_s", math.nan)
        result["parse_s"] = 0.0
        if variant == NG and out.exists():
            result.update(parse_jsonl(out))
            if not keep_output:
                out.unlink()  # the results can be large; the count and statuses are kept
        n = result.get("written", 0)
        time_s = result["collect_s"] + result["parse_s"]
        result["rate"] = n / time_s if time_s > 0 else math.nan
        result["rate_wall"] = n / (result["wall_s"] + result["parse_s"])
        lat = result.pop("latencies_ms", [])
        result["latencies"] = len(lat)
        result["p50_ms"] = float(np.percentile(lat, 50)) if lat else math.nan
        result["p99_ms"] = float(np.percentile(lat, 99)) if lat else math.nan
        result["rss_mib"] = result.get("vm_hwm_kib", 0) / 1024
        cpu_s = result.get("collect_cpu_s", math.nan) + result.get("parse_cpu_s", 0.0)
        result["cpu_ms_per_rollout"] = 1000 * cpu_s / max(n, 1)
        return result


def parse_jsonl(path: Path) -> dict[str, Any]:
    """NeMo Gym's results into the SDK's training ``Batch``: every line's bytes parsed (its
    ``response`` and ``reward``; tagged with its task and rollout index), then collated."""
    began, cpu = time.perf_counter(), time.process_time()
    rollouts = []
    failure_classes: Counter[str] = Counter()
    for line in path.read_bytes().splitlines():
        if not line:
            continue
        failure = _FAILURE_CLASS.search(line)
        if failure:
            failure_classes[failure.group(1).decode()] += 1
        task, repeat = _TASK.search(line), _REPEAT.search(line)
        rollouts.append(
            parse_agent_response(
                line,
                EOS,
                row_id=task.group(1).decode() if task else None,
                repeat_index=int(repeat.group(1)) if repeat else None,
            )
        )
    batch = collate(rollouts, pad_token_id=PAD) if rollouts else None
    seconds = time.perf_counter() - began
    return {
        "parse_s": seconds,
        "parse_cpu_s": time.process_time() - cpu,
        "statuses": Counter(r.status.value for r in rollouts),
        "batch_ok": int(batch.ok.sum()) if batch is not None else 0,
        "batch_shape": (
            [list(batch.prompt_ids.shape), list(batch.completion_ids.shape)] if batch else None
        ),
        "reward_mean": float(batch.rewards.mean()) if batch is not None else math.nan,
        "failure_classes": failure_classes,
    }


# --- the benchmark --------------------------------------------------------------------------


def check(result: dict[str, Any], expected: int) -> None:
    """A throughput run must have every rollout back, parsed OK."""
    ok = result.get("batch_ok", 0)
    if result["code"] != 0 or result.get("written") != expected or ok != expected:
        raise RuntimeError(
            f"{result['variant']}: exit {result['code']}, {result.get('written')} of {expected} "
            f"rollouts, {ok} OK ({result.get('statuses')}); error {result.get('error')}; "
            f"see {result['log']}"
        )


def measure(bench: Bench, args: argparse.Namespace, variants: list[str]) -> dict:
    k = args.num_repeats
    warm = bench.rows_file(max(1, 64 // k))
    for variant in variants:  # warm-up: server pools, page cache; not counted
        check(bench.run(variant, warm, k, 16), max(1, 64 // k) * k)
    results: dict[int, dict[str, list[dict[str, Any]]]] = {}
    for concurrency in args.concurrency:
        n_rows = math.ceil(max(args.rollouts, 4 * concurrency) / k)
        rows = bench.rows_file(n_rows)
        results[concurrency] = {v: [] for v in variants}
        for repeat in range(args.repeats):
            # rotated: each variant takes each place once in len(variants) repeats, and
            # nemo_gym and sdk swap order from one repeat to the next
            order = variants[repeat % len(variants) :] + variants[: repeat % len(variants)]
            for variant in order:
                result = bench.run(variant, rows, k, concurrency)
                check(result, n_rows * k)
                results[concurrency][variant].append(result)
                print(
                    f"  c={concurrency:<4} repeat {repeat + 1} {variant:<9} "
                    f"{result['rate']:7.1f} rollouts/s  (whole process {result['rate_wall']:6.1f})"
                    f"  p50 {result['p50_ms']:6.1f} ms  p99 {result['p99_ms']:7.1f} ms"
                    f"  RSS {result['rss_mib']:5.0f} MiB",
                    flush=True,
                )
    return results


def failure_runs(bench: Bench, args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """One small run per side with one row whose episode fails."""
    rows, k, fail_at = 8, 4, 3
    path = bench.rows_file(rows, fail_at=fail_at)
    return {
        "nemo_gym (default)": bench.run(NG, path, k, 4, keep_output=True),
        "nemo_gym (route_failures_to_sidecar)": bench.run(
            NG, path, k, 4, sidecar=True, keep_output=True
        ),
        "sdk": bench.run(SDK, path, k, 4),
    }


def med(runs: list[dict[str, Any]], key: str) -> float:
    return statistics.median(r[key] for r in runs)


COMPONENTS = ("relay", "agent", "model", "resources", "standin")


def report(args: argparse.Namespace, results: dict, failures: dict, variants: list[str]) -> str:
    k = args.num_repeats
    lines = [
        f"example_single_tool_call (2 model calls + 1 tool call per rollout), rows x {k} "
        f"repeats, median of {args.repeats} runs per cell",
        "rate/s  = rollouts / (collection [+ parse and collate, for nemo_gym]);  "
        "whole/s = rollouts / (process wall incl. interpreter start [+ parse])",
        "p50/p99 = send-to-receive per rollout (slot held, POST /run, answer read);  "
        "CPU ms  = the collector's own CPU per rollout during collection (+ parse)",
        "% of one core during the collection: coll(ector), relay, agent, model server, "
        "resources server, stand-in; other = any other process on the box; "
        f"box = all CPUs busy ({os.cpu_count()} CPUs = {100 * (os.cpu_count() or 1)})",
        "",
        f"{'conc':>4} {'variant':<9} {'rollouts':>8} {'rate/s':>7} {'whole/s':>7} "
        f"{'p50 ms':>7} {'p99 ms':>7} {'RSS MiB':>7} {'CPU ms':>6} "
        f"{'coll':>5}{''.join(f'{n[:5]:>6}' for n in COMPONENTS)} {'other':>5} {'box':>5}",
    ]
    for concurrency, by_variant in results.items():
        for variant in variants:
            runs = by_variant[variant]
            share = [
                statistics.median(r["server_cpu_share"].get(name, 0.0) for r in runs)
                for name in COMPONENTS
            ]
            collector = statistics.median(r["collect_cpu_s"] / r["collect_s"] for r in runs)
            box = statistics.median(os.cpu_count() * r["machine"]["busy"] for r in runs)
            other = statistics.median(
                os.cpu_count() * r["machine"]["busy"]
                - r["collect_cpu_s"] / r["collect_s"]
                - sum(r["server_cpu_share"].values())
                for r in runs
            )
            lines.append(
                f"{concurrency:>4} {variant:<9} {runs[0]['written']:>8} {med(runs, 'rate'):>7.1f} "
                f"{med(runs, 'rate_wall'):>7.1f} {med(runs, 'p50_ms'):>7.0f} "
                f"{med(runs, 'p99_ms'):>7.0f} {med(runs, 'rss_mib'):>7.0f} "
                f"{med(runs, 'cpu_ms_per_rollout'):>6.2f} {100 * collector:>5.0f}"
                + "".join(f"{100 * x:>6.0f}" for x in share)
                + f" {100 * other:>5.0f} {100 * box:>5.0f}"
            )
        sdk, ng = by_variant[SDK], by_variant[NG]
        paired = ", ".join(f"{a['rate'] / b['rate']:.2f}" for a, b in zip(sdk, ng, strict=True))
        ratio = (
            f"{'':>4} sdk/nemo_gym: rate {med(sdk, 'rate') / med(ng, 'rate'):.2f}x "
            f"(per repeat {paired}), "
            f"whole {med(sdk, 'rate_wall') / med(ng, 'rate_wall'):.2f}x, "
            f"RSS {med(sdk, 'rss_mib') / med(ng, 'rss_mib'):.2f}x"
        )
        if SDK_RELAY in by_variant:
            relay = by_variant[SDK_RELAY]
            ratio += f"; sdk_relay/nemo_gym rate {med(relay, 'rate') / med(ng, 'rate'):.2f}x"
        lines.append(ratio)
        lines.append(
            f"{'':>4} nemo_gym: parse+collate {1000 * med(ng, 'parse_s'):.0f} ms after "
            f"{1000 * med(ng, 'collect_s'):.0f} ms of collection; process start and imports "
            f"{med(ng, 'import_s'):.1f} s (sdk {med(sdk, 'import_s'):.1f} s)"
        )
    if not failures:
        return "\n".join(lines)
    lines.append("")
    lines.append(
        "failure run: 8 rows x 4 repeats at concurrency 4; row 3's 4 episodes fail "
        "(the stand-in answers their first model call with HTTP 400)"
    )
    for name, r in failures.items():
        if name.startswith("nemo_gym"):
            lines.append(
                f"  {name}: exit {r['code']}, {r.get('written', 0)} of 32 rollouts written "
                f"({r.get('failure_rows', 0)} of them failure rows "
                f"{dict(r.get('failure_classes', {}))}), parsed by the SDK as "
                f"{dict(r.get('statuses', {}))}; error: {r.get('error')}"
            )
        else:
            lines.append(
                f"  {name}: exit {r['code']}, {r.get('written', 0)} of 32 rollouts returned, "
                f"statuses {dict(r.get('statuses', {}))}, batch {r.get('batch_shape')} "
                f"with {r.get('batch_ok')} OK rows"
            )
            for error, count in (r.get("errors") or {}).items():
                lines.append(f"    {count} x {error}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--rollouts",
        type=int,
        default=512,
        help="rollouts per run: max(this, 4 x concurrency), rounded up to whole rows",
    )
    parser.add_argument("--concurrency", type=int, nargs="+", default=[16, 64, 256])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--num-repeats", type=int, default=8, help="rollouts per row (a group)")
    parser.add_argument("--prompt-tokens", type=int, default=512)
    parser.add_argument("--generation-tokens", type=int, default=64)
    parser.add_argument("--no-relay-variant", action="store_true")
    parser.add_argument("--no-failure-runs", action="store_true")
    parser.add_argument("--workdir", help="logs, rows and stats (default: a temporary directory)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary workdir")
    args = parser.parse_args(argv)
    command = " ".join(
        [Path(sys.executable).relative_to(Path.cwd()).as_posix()]
        if Path(sys.executable).is_relative_to(Path.cwd())
        else [sys.executable]
    )
    command += " " + " ".join(["benchmarks/bench_collect.py", *(argv or sys.argv[1:])])
    temporary = args.workdir is None
    args.workdir = args.workdir or tempfile.mkdtemp(prefix="bench-collect-")
    Path(args.workdir).mkdir(parents=True, exist_ok=True)
    variants = [NG, SDK] + ([] if args.no_relay_variant else [SDK_RELAY])
    began = time.perf_counter()
    print(
        f"python {platform.python_version()} (sdk), {os.cpu_count()} CPUs, "
        f"load average {os.getloadavg()[0]:.2f}; workdir {args.workdir}",
        flush=True,
    )
    flags = ["--model", MODEL, "--prompt-tokens", str(args.prompt_tokens)]
    flags += ["--generation-tokens", str(args.generation_tokens)]
    try:
        with stand_in(*flags) as (url, standin_pid):
            stack = GymStack(
                [ENVIRONMENT],
                PolicyModel(base_url=f"{url}/v1", model=MODEL),
                head_server=True,
                environment_servers=True,
                workdir=Path(args.workdir) / "stack",
                ready_timeout=300,
                backend_timeout=30,
                default_max_steps=8,
            )
            with stack:
                bench = Bench(args, stack, standin_pid)
                results = measure(bench, args, variants)
                failures = {} if args.no_failure_runs else failure_runs(bench, args)
        load = os.getloadavg()[0]
        text = report(args, results, failures, variants)
        print("\n" + text)
        print(f"\nload average at the end {load:.2f}; {time.perf_counter() - began:.0f} s in all")
        print(f"command: {command}")
        summary = {
            "command": command,
            "results": {str(c): v for c, v in results.items()},
            "failures": failures,
        }
        (Path(args.workdir) / "results.json").write_text(json.dumps(summary, indent=1))
    finally:
        if temporary and not args.keep:
            shutil.rmtree(args.workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
