"""A local NeMo Gym agent + resources server for the client benchmarks, in its own process.

Run as a script it serves, on 127.0.0.1 and an ephemeral port (printed as ``PORT <n>``):

- ``POST /run``: a canned multi-turn ``/run`` result (token ids and logprobs on every
  model turn, each prompt repeating the history), the same bytes every time; with
  ``--fault-rate`` a deterministic share of requests gets a 503 or a reset connection.
- ``POST /seed_session``: sets a ``session`` cookie.
- ``POST /verify``: sleeps ``--verify-ms`` (emulated work, without blocking the loop),
  then returns a reward.

``start_server(...)`` (for the benchmark scripts) starts it as a child process, waits for
its port and stops it by PID. Running the server in its own process keeps it off the
benchmark's GIL, as a real agent would be.

Usage: python benchmarks/local_servers.py [--turns 3] [--verify-ms 10] [--fault-rate 0.0]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import socket
import struct
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from aiohttp import web


def run_result(turns: int, prompt_tokens: int, generation_tokens: int) -> dict[str, Any]:
    """A realistic tool-calling ``/run`` result with ``turns`` model turns."""
    history = [(7 * i) % 150_000 + 3 for i in range(prompt_tokens)]
    output: list[dict[str, Any]] = []
    for t in range(turns):
        generation = [(11 * i + t) % 150_000 + 3 for i in range(generation_tokens)]
        last = t == turns - 1
        item: dict[str, Any] = (
            {
                "id": f"msg_{t}",
                "type": "message",
                "role": "assistant",
                "status": "completed",
                "content": [
                    {"type": "output_text", "text": "The answer is 42.", "annotations": []}
                ],
            }
            if last
            else {
                "id": f"fc_{t}",
                "type": "function_call",
                "call_id": f"call_{t}",
                "name": "search",
                "arguments": '{"query": "weather"}',
                "status": "completed",
            }
        )
        item |= {
            "prompt_token_ids": list(history),
            "generation_token_ids": generation,
            "generation_log_probs": [round(-0.01 * (i % 50), 4) for i in range(len(generation))],
        }
        output.append(item)
        history += generation
        if not last:
            output.append({"type": "function_call_output", "call_id": f"call_{t}", "output": "ok"})
            history += [5, 6, 7, 8]
    return {"response": {"id": "resp_bench", "output": output}, "reward": 1.0}


def _reset(request: web.Request) -> None:
    transport = request.transport
    if transport is None:
        return
    sock = transport.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()


def make_app(args: argparse.Namespace) -> web.Application:
    """The aiohttp app: /run, /seed_session and /verify."""
    body = json.dumps(run_result(args.turns, args.prompt_tokens, args.generation_tokens)).encode()
    period = round(1 / args.fault_rate) if args.fault_rate > 0 else 0
    counter = {"run": 0, "session": 0}

    async def run(request: web.Request) -> web.StreamResponse:
        await request.read()
        counter["run"] += 1
        n = counter["run"]
        if period and n % period == 0:
            if (n // period) % 2:
                return web.json_response({"detail": "busy"}, status=503)
            _reset(request)
            return web.Response()
        return web.Response(body=body, content_type="application/json")

    async def seed_session(request: web.Request) -> web.Response:
        await request.read()
        counter["session"] += 1
        response = web.json_response({})
        response.set_cookie("session", str(counter["session"]))
        return response

    async def verify(request: web.Request) -> web.Response:
        await request.read()
        await asyncio.sleep(args.verify_ms / 1000)
        return web.json_response({"reward": 1.0})

    app = web.Application(client_max_size=64 * 1024**2)
    app.add_routes(
        [
            web.post("/run", run),
            web.post("/seed_session", seed_session),
            web.post("/verify", verify),
        ]
    )
    return app


async def serve_app(app: web.Application, port: int = 0, backlog: int = 1024) -> None:
    """Serve ``app`` on 127.0.0.1, print ``PORT <n>`` (what `start_script` reads), and run
    until SIGTERM or SIGINT."""
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port, backlog=backlog)
    await site.start()
    print(f"PORT {runner.addresses[0][1]}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await runner.cleanup()


async def _serve(args: argparse.Namespace) -> None:
    await serve_app(make_app(args), args.port)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--prompt-tokens", type=int, default=400)
    parser.add_argument("--generation-tokens", type=int, default=60)
    parser.add_argument("--verify-ms", type=float, default=10.0)
    parser.add_argument("--fault-rate", type=float, default=0.0)
    return parser.parse_args(argv)


@contextmanager
def start_script(script: str | Path, *flags: str) -> Iterator[tuple[str, int]]:
    """Start a server script (one that serves with `serve_app`) as a child process; yield
    ``(base_url, pid)``; stop it by its PID."""
    process = subprocess.Popen(
        [sys.executable, str(script), *flags], stdout=subprocess.PIPE, text=True
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        if not line.startswith("PORT "):
            raise RuntimeError(f"{Path(script).name} did not start: {line!r}")
        yield f"http://127.0.0.1:{int(line.split()[1])}", process.pid
    finally:
        process.terminate()  # this child only, by its PID
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def start_server(*flags: str) -> Any:
    """Start this script as a child process; yield ``(base_url, pid)``; stop it by PID."""
    return start_script(__file__, *flags)


if __name__ == "__main__":
    asyncio.run(_serve(parse_args()))
