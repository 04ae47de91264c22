"""Sampler scaling through a real ``vllm-router``: 1, 2, 4 and 8 replicas, group affinity.

The replicas are stand-ins that cost no CPU (``standin_sampler.py``: vLLM's measured
throughput against batch size, played out in time), so this 2-core machine measures the
router and the routing, not a model. The client plays GRPO-shaped load: groups of
``--group`` episodes that share one affinity key (``x-session-id``, what the SDK's proxy
sends for a group), each episode ``--turns`` completions of ``--tokens`` tokens, and keeps
``--per-replica`` episodes in flight per replica (a new group starts as soon as one ends).

Reported per router policy and replica count, over a ``--seconds`` window after a warm-up:
rollouts (episodes) per second, the scaling efficiency ``rps(N) / (N * rps(1))``, the group
affinity (share of groups whose every request reached one replica), and how evenly the
replicas were loaded (the busiest replica's requests over the mean).

    .venv/bin/python benchmarks/bench_router_scaling.py --replicas 1 2 4 8
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from standin_sampler import start_standins

from nemogym_sdk.gym import start_router
from nemogym_sdk.wire import ROUTER_SESSION_HEADER

POLICIES = ("consistent_hash", "sticky_least_loaded")


async def play(router: str, args: argparse.Namespace, in_flight: int) -> dict[str, Any]:
    """Keep ``in_flight`` episodes playing in groups; count those finished in the window."""
    keys = itertools.count()
    finished: list[float] = []
    groups_done: list[str] = []
    began = time.monotonic()
    stop_at = began + args.warmup + args.seconds
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as http:

        async def episode(key: str) -> None:
            prompt = list(range(64))
            for _ in range(args.turns):
                body = {"model": "standin", "prompt": prompt, "max_tokens": args.tokens}
                headers = {ROUTER_SESSION_HEADER: key}
                async with http.post(
                    f"{router}/v1/completions", json=body, headers=headers
                ) as answer:
                    answer.raise_for_status()
                    data = await answer.json()
                prompt = prompt + data["choices"][0]["token_ids"][:8]
            finished.append(time.monotonic())

        async def group() -> None:
            while time.monotonic() < stop_at:
                key = f"group-{next(keys)}"
                await asyncio.gather(*(episode(key) for _ in range(args.group)))
                groups_done.append(key)

        await asyncio.gather(*(group() for _ in range(max(1, in_flight // args.group))))
    start = began + args.warmup
    window = [t for t in finished if start <= t <= start + args.seconds]
    return {"rps": len(window) / args.seconds, "groups": groups_done}


async def measure(policy: str, replicas: int, args: argparse.Namespace) -> dict[str, Any]:
    with start_standins(replicas, args.speedup) as urls:
        with start_router(urls, policy=policy) as router:
            played = await play(router.url, args, args.per_replica * replicas)
        async with aiohttp.ClientSession() as http, http.get(f"{urls[0]}/stats") as answer:
            stats = await answer.json()
    sessions = stats["sessions"]
    done = [key for key in played["groups"] if key in sessions]
    sticky = sum(1 for key in done if len(sessions[key]) == 1)
    served = stats["served"]
    return {
        "rps": played["rps"],
        "affinity": sticky / len(done) if done else float("nan"),
        "imbalance": max(served) / statistics.mean(served) if sum(served) else float("nan"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--policies", nargs="+", default=list(POLICIES), choices=POLICIES)
    parser.add_argument("--per-replica", type=int, default=32, help="episodes in flight each")
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--speedup", type=float, default=1.0)
    parser.add_argument("--warmup", type=float, default=5.0)
    parser.add_argument("--seconds", type=float, default=20.0)
    args = parser.parse_args()
    print(
        f"stand-in replicas (vLLM CPU curve x{args.speedup}), {args.per_replica} episodes in "
        f"flight per replica, groups of {args.group}, {args.turns} turns x {args.tokens} tokens, "
        f"{args.seconds:g} s window after {args.warmup:g} s"
    )
    for policy in args.policies:
        base = None
        print(f"\nvllm-router --policy {policy}")
        print("  replicas  rollouts/s  efficiency  group affinity  busiest/mean")
        for count in args.replicas:
            result = asyncio.run(measure(policy, count, args))
            if base is None:
                base = result["rps"] / count
            efficiency = result["rps"] / (count * base)
            print(
                f"  {count:8d}  {result['rps']:10.1f}  {efficiency:10.2f}  "
                f"{100 * result['affinity']:13.1f}%  {result['imbalance']:12.2f}"
            )


if __name__ == "__main__":
    main()
