"""AgentClient vs a minimal raw-aiohttp loop; Verifier fan-out vs sequential ``requests``.

Starts ``local_servers.py`` in a separate process (so client and server do not share one
GIL) and measures, in one run, alternating the order of the variants each repeat:

  /run, at each concurrency, ``--rollouts`` rollouts per batch:
    (a) raw:        one aiohttp.ClientSession, a Semaphore, gather of POST /run reading
                    the body (the minimal loop every integration writes)
    (b) run_raw:    AgentClient.run_raw: the same work plus routing, retries,
                    deadlines, per-host limits, tagging (no parsing), results in order
    (c) run:        AgentClient.run: (b) plus parsing every result into a Rollout as it
                    arrives (while the others are still playing)
    (d) stream:     AgentClient.stream: (c), yielded as each rollout completes
  /verify, over ``--verify-items`` items on a server whose /verify takes ``--verify-ms``:
    (e) sequential: requests.post per item, one after another (the seed's reward function)
    (f) Verifier.verify_sync, with and without /seed_session first

Reports the median rollouts/s (items/s) of ``--repeats`` repeats and the ratios. Also
reported: the server process's CPU use during each measurement (near 100 % of a core
means the server, not the client, bounds the rate), and the client's CPU time per
rollout (less sensitive than wall time to other load on a shared machine).

Usage: python benchmarks/bench_client.py [--rollouts 5000] [--concurrency 64 256]
                                          [--repeats 5] [--verify-items 256]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import platform
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import requests

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from local_servers import start_server

from nemogym_sdk import AgentClient, RetryPolicy, Rollout, TaskRow, Verifier, VerifyItem
from nemogym_sdk.wire import build_response, build_verify_body

EOS = 2


def make_rows(n: int) -> list[TaskRow]:
    """NeMo Gym dataset rows of a realistic size (a system prompt, a user turn, one tool)."""
    tool = {
        "type": "function",
        "name": "search",
        "description": "Search the web.",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"}}},
    }
    return [
        TaskRow(
            row_id=f"bench.jsonl:{i}",
            data={
                "responses_create_params": {
                    "input": [
                        {"role": "system", "content": "You are a helpful assistant. " * 8},
                        {"role": "user", "content": f"Question {i}: what is the weather?"},
                    ],
                    "tools": [tool],
                    "temperature": 1.0,
                },
                "expected_answer": str(i),
            },
        )
        for i in range(n)
    ]


def server_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds used so far by process ``pid``."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# --- /run -----------------------------------------------------------------------------------


class RawLoop:
    """The minimal raw-aiohttp loop: one session (reused), a semaphore, gather."""

    def __init__(self, url: str, concurrency: int) -> None:
        self.url = f"{url}/run"
        self.concurrency = concurrency
        self.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))

    async def run(self, rows: list[TaskRow]) -> list[bytes]:
        semaphore = asyncio.Semaphore(self.concurrency)

        async def one(row: TaskRow) -> bytes:
            async with semaphore, self.session.post(self.url, json=dict(row.data)) as response:
                response.raise_for_status()
                return await response.read()

        return await asyncio.gather(*(one(row) for row in rows))

    async def close(self) -> None:
        await self.session.close()


async def collect(client: AgentClient, rows: list[TaskRow]) -> list[Rollout]:
    """Every rollout of ``stream``, as they complete."""
    return [rollout async for rollout in client.stream(rows, eos_token_id=EOS)]


async def measure_run(
    url: str, pid: int, rows: list[TaskRow], concurrency: int, repeats: int
) -> dict[str, list[tuple[float, float, float]]]:
    """(rollouts/s, server CPU share, client CPU us per rollout) per variant and repeat."""
    raw_loop = RawLoop(url, concurrency)
    client = AgentClient(
        {"bench": url},
        max_concurrency=concurrency,
        max_per_host=concurrency,
        retry=RetryPolicy(max_attempts=1),
    )
    await client.__aenter__()

    async def raw() -> None:
        bodies = await raw_loop.run(rows)
        assert len(bodies) == len(rows) and all(bodies)

    async def run_raw() -> None:
        raws = await client.run_raw(rows)
        assert len(raws) == len(rows) and all(r.body for r in raws), raws[0].error

    async def stream() -> None:
        rollouts = await collect(client, rows)
        assert len(rollouts) == len(rows) and all(r.ok for r in rollouts), rollouts[0].error

    async def run() -> None:
        rollouts = await client.run(rows, eos_token_id=EOS)
        assert len(rollouts) == len(rows) and all(r.ok for r in rollouts), rollouts[0].error

    variants: dict[str, Callable[[], Awaitable[None]]] = {
        "raw": raw,
        "run_raw": run_raw,
        "run": run,
        "stream": stream,
    }
    warm = rows[: min(len(rows), 2 * concurrency)]
    await raw_loop.run(warm)
    await client.run_raw(warm)
    results: dict[str, list[tuple[float, float, float]]] = {name: [] for name in variants}
    names = list(variants)
    try:
        for repeat in range(repeats):
            order = names[repeat % len(names) :] + names[: repeat % len(names)]
            if repeat % 2:
                order.reverse()
            for name in order:
                gc.collect()
                cpu0, ours0 = server_cpu_seconds(pid), time.process_time()
                t0 = time.perf_counter()
                await variants[name]()
                seconds = time.perf_counter() - t0
                share = (server_cpu_seconds(pid) - cpu0) / seconds
                ours = 1e6 * (time.process_time() - ours0) / len(rows)
                results[name].append((len(rows) / seconds, share, ours))
    finally:
        await raw_loop.close()
        await client.aclose()
    return results


# --- /verify --------------------------------------------------------------------------------


def measure_verify(url: str, n_items: int, repeats: int) -> dict[str, list[float]]:
    """Items/s of sequential requests.post vs Verifier (with / without /seed_session)."""
    rows = [
        {
            "responses_create_params": {"input": [{"role": "user", "content": f"q{i}"}]},
            "expected_answer": str(i),
        }
        for i in range(n_items)
    ]
    completions = [f"<think>let me see</think>The answer is {i}." for i in range(n_items)]
    items = [
        VerifyItem(resources_server="rs", row=row, completion=text)
        for row, text in zip(rows, completions, strict=True)
    ]
    bodies = [
        build_verify_body(row, build_response(text, model="policy", tools=[]))
        for row, text in zip(rows, completions, strict=True)
    ]

    def sequential() -> None:
        rewards = []
        for body in bodies:  # the seed: one blocking requests.post per item, no session
            answer = requests.post(f"{url}/verify", json=body, timeout=30)
            rewards.append(answer.json()["reward"] if answer.ok else 0.0)
        assert rewards == [1.0] * n_items

    seeded = Verifier({"rs": url})
    unseeded = Verifier({"rs": url}, seed_session=False)

    def verifier(which: Verifier) -> Callable[[], None]:
        def go() -> None:
            results = which.verify_sync(items)
            assert [r.reward for r in results] == [1.0] * n_items, results[0].error

        return go

    variants: dict[str, Callable[[], None]] = {
        "sequential": sequential,
        "verifier": verifier(seeded),
        "verifier_no_seed": verifier(unseeded),
    }
    for go in variants.values():  # warm-up
        go()
    results: dict[str, list[float]] = {name: [] for name in variants}
    names = list(variants)
    try:
        for repeat in range(repeats):
            order = names[repeat % len(names) :] + names[: repeat % len(names)]
            for name in order:
                t0 = time.perf_counter()
                variants[name]()
                results[name].append(n_items / (time.perf_counter() - t0))
    finally:
        seeded.close()
        unseeded.close()
    return results


# --- report ---------------------------------------------------------------------------------


def median(values: list[float]) -> float:
    return statistics.median(values)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=5000)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--verify-items", type=int, default=256)
    parser.add_argument("--verify-ms", type=float, default=10.0)
    parser.add_argument("--verify-repeats", type=int, default=3)
    args = parser.parse_args(argv)

    print(
        f"python {platform.python_version()}, aiohttp {aiohttp.__version__}, "
        f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}"
    )
    report: dict[str, Any] = {}
    rows = make_rows(args.rollouts)
    with start_server("--turns", str(args.turns)) as (url, pid):
        for concurrency in args.concurrency:
            results = asyncio.run(measure_run(url, pid, rows, concurrency, args.repeats))
            rates = {name: median([r[0] for r in runs]) for name, runs in results.items()}
            shares = {name: median([r[1] for r in runs]) for name, runs in results.items()}
            cpu = {name: median([r[2] for r in runs]) for name, runs in results.items()}
            print(
                f"\n/run  {args.rollouts} rollouts, concurrency {concurrency}, median of "
                f"{args.repeats}  [server CPU share]  (client CPU per rollout)"
            )
            for name, rate in rates.items():
                print(
                    f"  {name:<11} {rate:8.0f} rollouts/s  [{shares[name]:4.0%}]  "
                    f"({cpu[name]:.0f} us)"
                )
            print(
                f"  run_raw / raw = {rates['run_raw'] / rates['raw']:.2f}x   "
                f"stream / raw = {rates['stream'] / rates['raw']:.2f}x   "
                f"run / raw = {rates['run'] / rates['raw']:.2f}x"
            )
            paired = [
                f"{s[0] / r[0]:.2f}"
                for s, r in zip(results["run_raw"], results["raw"], strict=True)
            ]
            print(f"  run_raw / raw per repeat: {', '.join(paired)}")
            report[f"run@{concurrency}"] = rates

    with start_server("--verify-ms", str(args.verify_ms)) as (url, _):
        results_v = measure_verify(url, args.verify_items, args.verify_repeats)
    rates_v = {name: median(runs) for name, runs in results_v.items()}
    print(
        f"\n/verify  {args.verify_items} items, server work {args.verify_ms:g} ms each, "
        f"median of {args.verify_repeats}"
    )
    for name, rate in rates_v.items():
        print(f"  {name:<17} {rate:8.0f} items/s")
    print(
        f"  verifier / sequential = {rates_v['verifier'] / rates_v['sequential']:.1f}x   "
        f"(without /seed_session: "
        f"{rates_v['verifier_no_seed'] / rates_v['sequential']:.1f}x)"
    )
    report["verify"] = rates_v
    print(f"\nload average at the end {os.getloadavg()[0]:.1f}")
    return report


if __name__ == "__main__":
    main()
