"""NeMo Gym's own rollout collection, as one process (run by NeMo Gym's Python 3.13 venv).

Used by ``bench_collect.py``; never imports ``nemogym_sdk``. It does what a trainer
integration driving NeMo Gym's Python API does (NeMo RL's ``NemoGym`` actor, ``gym eval run``
minus its aggregation and health-check artifacts):

1. ``RolloutCollectionHelper().preprocess_examples(rows, num_repeats=K)``: the ``aabb``
   expansion, ``_ng_task_index`` / ``_ng_rollout_index`` stamps;
2. dispatch with ``asyncio.Semaphore(concurrency)`` (``num_samples_in_parallel``), through
   ``RolloutCollectionHelper._run_examples_with_metadata`` -- the dispatcher ``run_examples``
   wraps (same requests, same defaults), used here because it also hands back NeMo Gym's own
   per-rollout ``rollout_latency_ms`` (from the moment the rollout holds its semaphore slot
   and posts ``/run`` until the answer is read and JSON-decoded). It finds the environment
   server through the head server's ``/global_config_dict_yaml`` and posts ``/run`` there;
3. each result gets the collector's keys (``_ng_task_index``, ``_ng_rollout_index``,
   ``agent_ref``, ``_ng_environment_server``, ``_ng_result_type``), as ``gym eval run`` adds
   them, and is appended to the output JSONL (``orjson``), in completion order.

NeMo Gym's default is kept: the first failed ``/run`` raises and ends the collection (the
process exits non-zero); ``--route-failures-to-sidecar`` turns that off, as NeMo Gym's flag of
that name does. Either way the stats JSON is written: rollouts written, the error if any,
latencies, peak RSS (``VmHWM``), CPU seconds. ``BENCH_START`` / ``BENCH_END`` lines on stdout
bracket the collection, so the parent can sample the servers' CPU over exactly that window.

Usage: .venv-gym/bin/python benchmarks/ng_collector.py --head HOST:PORT --input rows.jsonl
           --output out.jsonl --stats stats.json [--num-repeats 8] [--concurrency 64]
"""

from __future__ import annotations

import time

PROCESS_START = time.time()

import argparse  # noqa: E402
import asyncio  # noqa: E402
import json  # noqa: E402
import resource  # noqa: E402
import sys  # noqa: E402
import traceback  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import orjson  # noqa: E402
from nemo_gym.config_types import BaseServerConfig  # noqa: E402
from nemo_gym.rollout_collection import RolloutCollectionHelper  # noqa: E402

IMPORTED = time.time()

# the keys ``gym eval run`` copies from the dispatched row onto each result
_ROW_KEYS = ("_ng_task_index", "_ng_rollout_index", "agent_ref")


def vm_hwm_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return 0


async def collect(args: argparse.Namespace, stats: dict[str, Any]) -> None:
    rows = [orjson.loads(line) for line in Path(args.input).read_bytes().splitlines() if line]
    host, port = args.head.rsplit(":", 1)
    print("BENCH_START", flush=True)
    started, cpu = time.time(), time.process_time()
    stats["collect_started"] = started
    helper = RolloutCollectionHelper()
    examples = helper.preprocess_examples(rows, num_repeats=args.num_repeats)
    stats["dispatched"] = len(examples)
    latencies: list[float] = stats["latencies_ms"]
    with Path(args.output).open("wb") as out:
        futures = helper._run_examples_with_metadata(
            examples,
            head_server_config=BaseServerConfig(host=host, port=int(port)),
            semaphore=asyncio.Semaphore(args.concurrency),
            route_failures_to_sidecar=args.route_failures_to_sidecar,
        )
        for future in futures:
            completed = await future
            row, result = completed.row, completed.result
            for key in _ROW_KEYS:
                if key in row:
                    result[key] = row[key]
            if completed.environment_server is not None:
                result["_ng_environment_server"] = completed.environment_server
            if completed.environment_server_type is not None:
                result["_ng_result_type"] = completed.environment_server_type
            if completed.rollout_latency_ms is not None:
                latencies.append(completed.rollout_latency_ms)
            if result.get("_ng_failure_class") is not None:
                stats["failure_rows"] += 1
            out.write(orjson.dumps(result) + b"\n")
            stats["written"] += 1
    stats["collect_s"] = time.time() - started
    stats["collect_cpu_s"] = time.process_time() - cpu
    print("BENCH_END", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--head", required=True, help="the head server, HOST:PORT")
    parser.add_argument("--input", required=True, help="rows (JSONL), each with its agent_ref")
    parser.add_argument("--output", required=True, help="where the results go (JSONL)")
    parser.add_argument("--stats", required=True, help="where the measurements go (JSON)")
    parser.add_argument("--num-repeats", type=int, default=1)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--route-failures-to-sidecar", action="store_true")
    args = parser.parse_args()
    stats: dict[str, Any] = {
        "process_start": PROCESS_START,
        "import_s": IMPORTED - PROCESS_START,
        "written": 0,
        "failure_rows": 0,
        "latencies_ms": [],
        "error": None,
    }
    code = 0
    try:
        asyncio.run(collect(args, stats))
    except Exception as exc:  # noqa: BLE001 - NeMo Gym's abort: report it, exit non-zero
        stats["error"] = f"{type(exc).__name__}: {exc}"[:500]
        traceback.print_exc()
        print("BENCH_END", flush=True)
        code = 1
    usage = resource.getrusage(resource.RUSAGE_SELF)
    stats["cpu_s"] = usage.ru_utime + usage.ru_stime
    stats["vm_hwm_kib"] = vm_hwm_kib()
    Path(args.stats).write_text(json.dumps(stats))
    return code


if __name__ == "__main__":
    sys.exit(main())
