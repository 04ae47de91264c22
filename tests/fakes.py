"""Small real HTTP servers on loopback for client tests (aiohttp, in a background thread).

``agent_server`` answers ``POST /run`` with canned ``/run`` results and records every
body it receives; ``resources_server`` answers ``/seed_session`` (setting a session
cookie) and ``/verify``. They are real servers on 127.0.0.1 with ephemeral ports, so
the client under test does real HTTP; only the environment logic is canned.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import yaml
from aiohttp import web

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

SINGLE_TURN: dict[str, Any] = {
    "response": {
        "output": [
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "done", "annotations": []}],
                "prompt_token_ids": [1, 2, 3],
                "generation_token_ids": [7, 8],
                "generation_log_probs": [-0.5, -0.25],
            }
        ]
    },
    "reward": 1.0,
}


class FakeServer:
    """A running loopback server: its URL and what it received."""

    def __init__(self) -> None:
        self.url = ""
        self.bodies: list[Any] = []
        self.cookies: list[dict[str, str]] = []
        self.paths: Counter[str] = Counter()
        self.lock = threading.Lock()

    def calls(self, path: str) -> int:
        """How many requests arrived at ``path``."""
        with self.lock:
            return self.paths[path]

    def record(self, request: web.Request, body: Any) -> None:
        with self.lock:
            self.paths[request.path] += 1
            if request.path in ("/run", "/verify"):
                self.bodies.append(body)
                self.cookies.append(dict(request.cookies))


@contextmanager
def serve(routes: Callable[[FakeServer], list[web.RouteDef]]) -> Iterator[FakeServer]:
    """Run an aiohttp app with ``routes(server)`` on 127.0.0.1 in a background thread."""
    server = FakeServer()
    loop = asyncio.new_event_loop()
    started = threading.Event()
    runner_box: list[web.AppRunner] = []

    async def start() -> None:
        app = web.Application()
        app.add_routes(routes(server))
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        server.url = f"http://127.0.0.1:{port}"
        runner_box.append(runner)
        started.set()

    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    asyncio.run_coroutine_threadsafe(start(), loop).result(timeout=10)
    started.wait(10)
    try:
        yield server
    finally:
        asyncio.run_coroutine_threadsafe(runner_box[0].cleanup(), loop).result(timeout=10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        loop.close()


@contextmanager
def agent_server(responses: list[Any] | None = None) -> Iterator[FakeServer]:
    """An agent whose ``/run`` answers with ``responses`` in turn (cycled)."""
    answers = itertools.cycle(responses or [SINGLE_TURN])
    lock = threading.Lock()

    def routes(server: FakeServer) -> list[web.RouteDef]:
        async def run(request: web.Request) -> web.Response:
            body = await request.json()
            server.record(request, body)
            with lock:
                answer = next(answers)
            return web.json_response(answer)

        async def health(request: web.Request) -> web.Response:
            return web.json_response({"status": "ok"})

        return [web.post("/run", run), web.get("/", health)]

    with serve(routes) as server:
        yield server


@contextmanager
def resources_server(
    reward: float = 1.0, components: dict[str, float] | None = None
) -> Iterator[FakeServer]:
    """A resources server: ``/seed_session`` sets a cookie, ``/verify`` returns ``reward``.

    ``/verify`` answers 400 unless the request carries the cookie of a seeded session,
    as a stateful environment would.
    """
    sessions = itertools.count(1)

    def routes(server: FakeServer) -> list[web.RouteDef]:
        async def seed(request: web.Request) -> web.Response:
            server.record(request, await request.json())
            response = web.json_response({})
            response.set_cookie("session", str(next(sessions)))
            return response

        async def verify(request: web.Request) -> web.Response:
            body = await request.json()
            server.record(request, body)
            if "session" not in request.cookies:
                return web.json_response({"detail": "no session"}, status=400)
            answer = body | {"reward": reward}
            if components is not None:
                answer["reward_components"] = components
            return web.Response(text=json.dumps(answer), content_type="application/json")

        return [web.post("/seed_session", seed), web.post("/verify", verify)]

    with serve(routes) as server:
        yield server


@contextmanager
def head_server(
    config: Mapping[str, Any], instances: list[dict[str, Any]], *, ready: bool = True
) -> Iterator[FakeServer]:
    """NeMo Gym's head server for ``config``: ``/global_config_dict_yaml`` (YAML inside a
    JSON string), ``/server_instances`` and ``/readyz`` (503 while not ``ready``)."""

    def routes(server: FakeServer) -> list[web.RouteDef]:
        async def global_config(request: web.Request) -> web.Response:
            server.record(request, None)
            return web.Response(
                text=json.dumps(yaml.safe_dump(dict(config))), content_type="application/json"
            )

        async def server_instances(request: web.Request) -> web.Response:
            server.record(request, None)
            return web.json_response(instances)

        async def readyz(request: web.Request) -> web.Response:
            return web.json_response(
                {"status": "ok" if ready else "starting"}, status=200 if ready else 503
            )

        return [
            web.get("/global_config_dict_yaml", global_config),
            web.get("/server_instances", server_instances),
            web.get("/readyz", readyz),
        ]

    with serve(routes) as server:
        yield server


class Switch:
    """A loopback server that forwards every request to ``upstream`` (a ``.../v1`` URL,
    settable between requests): one NeMo Gym deployment pointed at ``base_url`` samples from
    one backend, then from another, without being started again."""

    def __init__(self) -> None:
        self.url = ""
        self.upstream: str | None = None

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:<port>/v1``: what ``PolicyModel`` takes."""
        return f"{self.url}/v1"


@contextmanager
def switch() -> Iterator[Switch]:
    """A running `Switch` (no upstream yet: it answers 503 until one is set)."""
    import aiohttp

    box = Switch()
    hop_by_hop = {"host", "content-length", "transfer-encoding", "connection"}

    async def forward(request: web.Request) -> web.StreamResponse:
        upstream = box.upstream
        if upstream is None:
            return web.Response(status=503, text="the switch has no upstream")
        root = upstream.removesuffix("/").removesuffix("/v1")
        headers = {k: v for k, v in request.headers.items() if k.lower() not in hop_by_hop}
        timeout = aiohttp.ClientTimeout(total=600)
        async with (
            aiohttp.ClientSession(timeout=timeout) as session,
            session.request(
                request.method, root + request.path_qs, data=await request.read(), headers=headers
            ) as answer,
        ):
            return web.Response(
                status=answer.status,
                body=await answer.read(),
                headers={"Content-Type": answer.headers.get("Content-Type", "application/json")},
            )

    with serve(lambda server: [web.route("*", "/{tail:.*}", forward)]) as server:
        box.url = server.url
        yield box
