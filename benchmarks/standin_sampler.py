"""Sampler replicas that cost no CPU: vLLM's measured throughput against batch size, in time.

Run as a script it serves ``--replicas`` stand-in samplers in one process, each on its own
127.0.0.1 port (printed as ``PORTS <p1> <p2> ...``). Each answers ``POST /v1/completions`` the
way a replica behind ``vllm-router`` is asked (token ids in, ``max_tokens`` out), but nothing
is computed: the replica shares its aggregate throughput among the requests it holds
(processor sharing), with the throughput against batch size that ``sim_async.py`` uses (vLLM
on this box with a LoRA adapter, 220 tokens/s alone to 3,400 at 32 in flight) times
``--speedup``; a request is answered when its ``max_tokens`` are "generated". Every request
is recorded with its replica and its ``x-session-id``: ``GET /stats`` on any port returns,
per replica, the requests served, and per session key, the replicas that served it.

``start_standins(n)`` starts it as a child process, yields the replica URLs, stops it by PID.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sim_async import throughput


class Replica:
    """Processor sharing in real time: each request gets throughput(b) / b tokens/s."""

    def __init__(self, index: int, speedup: float) -> None:
        self.index = index
        self.speedup = speedup
        self.active: dict[int, list[Any]] = {}  # id -> [tokens left, future]
        self.last = time.monotonic()
        self.timer: asyncio.TimerHandle | None = None
        self.ids = 0
        self.served = 0
        self.tokens = 0

    def rate(self) -> float:
        b = len(self.active)
        return throughput(b) * self.speedup / b if b else 0.0

    def _advance(self) -> None:
        now = time.monotonic()
        done = (now - self.last) * self.rate()
        self.last = now
        for entry in self.active.values():
            entry[0] -= done

    def _reschedule(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        finished = [i for i, (left, _) in self.active.items() if left <= 1e-9]
        for i in finished:
            _, future = self.active.pop(i)
            if not future.done():
                future.set_result(None)
        if self.active:
            soonest = min(left for left, _ in self.active.values())
            loop = asyncio.get_running_loop()
            self.timer = loop.call_later(soonest / self.rate(), self._tick)

    def _tick(self) -> None:
        self._advance()
        self._reschedule()

    async def generate(self, tokens: int) -> None:
        self._advance()
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.ids += 1
        self.active[self.ids] = [float(tokens), future]
        self._reschedule()
        await future
        self.served += 1
        self.tokens += tokens


def make_app(replica: Replica, sessions: dict[str, set[int]], replicas: list[Replica]) -> Any:
    async def completions(request: web.Request) -> web.Response:
        body = await request.json()
        key = request.headers.get("x-session-id", "")
        sessions[key].add(replica.index)
        tokens = int(body.get("max_tokens") or 16)
        await replica.generate(tokens)
        ids = [7] * tokens
        choice = {"index": 0, "text": "", "token_ids": ids, "finish_reason": "length"}
        return web.json_response({"object": "text_completion", "choices": [choice]})

    async def health(request: web.Request) -> web.Response:
        return web.Response()

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "standin", "parent": None}]})

    async def stats(request: web.Request) -> web.Response:
        return web.json_response(
            {
                "served": [r.served for r in replicas],
                "tokens": [r.tokens for r in replicas],
                "sessions": {k: sorted(v) for k, v in sessions.items()},
            }
        )

    app = web.Application()
    app.add_routes(
        [
            web.post("/v1/completions", completions),
            web.get("/health", health),
            web.get("/v1/models", models),
            web.get("/stats", stats),
        ]
    )
    return app


async def serve(count: int, speedup: float) -> None:
    sessions: dict[str, set[int]] = collections.defaultdict(set)
    replicas = [Replica(i, speedup) for i in range(count)]
    ports = []
    for replica in replicas:
        runner = web.AppRunner(make_app(replica, sessions, replicas), access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        ports.append(runner.addresses[0][1])
    print("PORTS", *ports, flush=True)
    await asyncio.Event().wait()


@contextmanager
def start_standins(count: int, speedup: float = 1.0) -> Iterator[list[str]]:
    """Start ``count`` stand-in replicas in a child process; yield their ``http://host:port``."""
    process = subprocess.Popen(
        [sys.executable, __file__, "--replicas", str(count), "--speedup", str(speedup)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline().split()
        if not line or line[0] != "PORTS":
            raise RuntimeError(f"stand-in samplers did not start: {line}")
        yield [f"http://127.0.0.1:{port}" for port in line[1:]]
    finally:
        process.terminate()
        process.wait(10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", type=int, default=1)
    parser.add_argument("--speedup", type=float, default=1.0)
    args = parser.parse_args()
    asyncio.run(serve(args.replicas, args.speedup))


if __name__ == "__main__":
    main()
