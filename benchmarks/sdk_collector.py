"""The SDK's rollout collection, as one process (run by the SDK's interpreter).

Used by ``bench_collect.py``, the counterpart of ``ng_collector.py``: discovery through the
head server (``ServerDirectory.from_head``), ``AgentClient(directory,
max_concurrency=C, max_per_host=C).run_sync(rows, num_generations=K)``, then ``collate``
into the training ``Batch``. With ``--via-relay`` the agent's ``/run`` goes to its NeMo Gym
environment server (the ``legacy_agent`` relay NeMo Gym's collector posts to) instead of to
the agent itself, to separate the relay's hop from the client's work.

Per-rollout latency, the definition ``ng_collector.py`` gets from NeMo Gym: from the moment
the rollout holds its concurrency slot and posts ``/run`` until the whole answer is read (here:
the client's ``_send``, wrapped with a timer; retries included; the parse comes after).

Writes a stats JSON (rollouts by status, attempts, latencies, peak RSS (``VmHWM``), CPU
seconds, batch shape) and prints ``BENCH_START`` / ``BENCH_END`` around the collection.

Usage: .venv/bin/python benchmarks/sdk_collector.py --head http://HOST:PORT --input rows.jsonl
           --stats stats.json [--num-repeats 8] [--concurrency 64] [--via-relay]
"""

from __future__ import annotations

import time

PROCESS_START = time.time()

import argparse  # noqa: E402
import collections  # noqa: E402
import json  # noqa: E402
import resource  # noqa: E402
import sys  # noqa: E402
from collections.abc import Awaitable, Callable  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

from nemogym_sdk import AgentClient, ServerDirectory, collate  # noqa: E402
from nemogym_sdk.directory import ENVIRONMENTS  # noqa: E402

IMPORTED = time.time()
EOS = 2
PAD = 0


def vm_hwm_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return 0


def short(text: str, head: int = 150, tail: int = 60) -> str:
    """``text``, its middle cut out when it is long (the retry count is at its end)."""
    return text if len(text) <= head + tail + 5 else f"{text[:head]} ... {text[-tail:]}"


def timed(send: Callable[..., Awaitable[Any]], into: list[float]) -> Callable[..., Awaitable[Any]]:
    """``send`` that appends its duration (ms) to ``into``."""

    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        began = time.perf_counter()
        try:
            return await send(*args, **kwargs)
        finally:
            into.append(1000 * (time.perf_counter() - began))

    return wrapper


def relay_agents(directory: ServerDirectory) -> dict[str, str]:
    """Agent name -> the URL of the environment server that relays its ``/run``."""
    agents: dict[str, str] = {}
    for server in directory.servers(ENVIRONMENTS):
        agent = (server.config.get("agent_server") or {}).get("name")
        if agent:
            agents[agent] = server.url
    return agents


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--head", required=True, help="the head server's URL")
    parser.add_argument("--input", required=True, help="rows (JSONL), each with its agent_ref")
    parser.add_argument("--stats", required=True, help="where the measurements go (JSON)")
    parser.add_argument("--num-repeats", type=int, default=1)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--via-relay", action="store_true")
    args = parser.parse_args()
    rows = [json.loads(line) for line in Path(args.input).read_text().splitlines() if line]
    latencies: list[float] = []

    print("BENCH_START", flush=True)
    started, cpu = time.time(), time.process_time()
    directory = ServerDirectory.from_head(args.head)
    agents: ServerDirectory | dict[str, str] = (
        relay_agents(directory) if args.via_relay else directory
    )
    client = AgentClient(agents, max_concurrency=args.concurrency, max_per_host=args.concurrency)
    client._send = timed(client._send, latencies)  # type: ignore[method-assign]
    with client:
        rollouts = client.run_sync(rows, eos_token_id=EOS, num_generations=args.num_repeats)
    batch = collate(rollouts, pad_token_id=PAD)
    collect_s = time.time() - started
    collect_cpu_s = time.process_time() - cpu
    print("BENCH_END", flush=True)

    usage = resource.getrusage(resource.RUSAGE_SELF)
    errors = collections.Counter(r.error for r in rollouts if not r.ok)
    stats = {
        "process_start": PROCESS_START,
        "import_s": IMPORTED - PROCESS_START,
        "collect_s": collect_s,
        "collect_cpu_s": collect_cpu_s,
        "written": len(rollouts),
        "statuses": collections.Counter(r.status.value for r in rollouts),
        "errors": {short(str(error)): count for error, count in errors.items()},
        "latencies_ms": latencies,
        "requests": len(latencies),
        "batch_shape": [list(batch.prompt_ids.shape), list(batch.completion_ids.shape)],
        "batch_ok": int(batch.ok.sum()),
        "drift": sum(1 for r in rollouts if r.status.value == "drift"),
        "reward_mean": float(batch.rewards.mean()),
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "vm_hwm_kib": vm_hwm_kib(),
        "error": None,
    }
    Path(args.stats).write_text(json.dumps(stats))
    return 0


if __name__ == "__main__":
    sys.exit(main())
