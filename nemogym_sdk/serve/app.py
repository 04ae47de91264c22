"""The aiohttp application (vLLM's routes) and ways to run it: async, or in a background thread.

Model work runs on a pool of threads, so the event loop stays free to answer ``/health`` and
``/v1/models`` while requests generate; generations asked for at once are decoded as one batch
(`nemogym_sdk.serve.batch`), and adapter loads run alone.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import attrs
from aiohttp import web

from nemogym_sdk.hosts import base_url
from nemogym_sdk.serve.engine import ServeEngine
from nemogym_sdk.serve.errors import BadRequestError, ServeError, error_body
from nemogym_sdk.wire import (
    ABORT_EPISODE_ROUTE,
    EPISODE_ID_PARAM,
    ROUTER_FINISH_SESSION,
    SESSION_ID,
)

__all__ = ["RunningServer", "ServerThread", "create_app", "start_server"]

logger = logging.getLogger(__name__)

T = TypeVar("T")
ENGINE_KEY = web.AppKey("nemogym_serve_engine", ServeEngine)
_MAX_BODY = 512 * 1024 * 1024  # multi-turn token histories are large
ROUTES: dict[str, tuple[str, ...]] = {
    "/health": ("get",),
    "/v1/models": ("get",),
    "/v1/chat/completions": ("post",),
    "/v1/completions": ("post",),
    "/tokenize": ("post",),
    "/v1/load_lora_adapter": ("post",),
    "/v1/unload_lora_adapter": ("post",),
    "/openapi.json": ("get",),
}


class _Worker:
    """Runs model calls on ``threads`` threads, that many at once; ``exclusive`` calls
    (adapter loads) run alone and go before every call still waiting, so publishing a new
    version waits only for the calls already running, never behind a queue of them (an
    asynchronous trainer publishes while episodes play)."""

    def __init__(self, threads: int) -> None:
        self.threads = threads
        self.executor = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="nemogym-serve")
        self._turn = asyncio.Condition()
        self._running = 0
        self._alone = False
        self._queued_alone = 0

    async def run(self, fn: Callable[..., T], *args: Any, exclusive: bool = False) -> T:
        async with self._turn:
            if exclusive:
                self._queued_alone += 1
                try:
                    await self._turn.wait_for(lambda: self._running == 0)
                finally:
                    self._queued_alone -= 1
                self._alone = True
            else:
                await self._turn.wait_for(
                    lambda: (
                        self._queued_alone == 0 and not self._alone and self._running < self.threads
                    )
                )
            self._running += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)
        finally:
            async with self._turn:
                self._running -= 1
                self._alone = self._alone and not exclusive
                self._turn.notify_all()


WORKER_KEY = web.AppKey("nemogym_serve_worker", _Worker)


@web.middleware
async def _errors(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    try:
        return await handler(request)
    except ServeError as error:
        return web.json_response(error_body(error), status=error.status)
    except web.HTTPException:
        raise
    except Exception as error:  # answer 500 instead of dropping the connection
        logger.exception("internal error on %s %s", request.method, request.path)
        failure = ServeError(f"{type(error).__name__}: {error}")
        return web.json_response(error_body(failure), status=500)


async def _body(request: web.Request) -> Any:
    try:
        return await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise BadRequestError(f"The request body is not valid JSON: {error}") from error


async def _health(request: web.Request) -> web.StreamResponse:
    return web.Response(status=200)


async def _models(request: web.Request) -> web.StreamResponse:
    return web.json_response(request.app[ENGINE_KEY].list_models())


# The LoRA request bodies, described like vLLM's FastAPI schema, so that a client can tell
# from /openapi.json alone that adapters reload in place (``load_inplace``).
_SCHEMAS: dict[str, dict[str, Any]] = {
    "LoadLoRAAdapterRequest": {
        "type": "object",
        "title": "LoadLoRAAdapterRequest",
        "properties": {
            "lora_name": {"type": "string", "title": "Lora Name"},
            "lora_path": {"type": "string", "title": "Lora Path"},
            "load_inplace": {"type": "boolean", "title": "Load Inplace", "default": False},
        },
        "required": ["lora_name", "lora_path"],
    },
    "UnloadLoRAAdapterRequest": {
        "type": "object",
        "title": "UnloadLoRAAdapterRequest",
        "properties": {"lora_name": {"type": "string", "title": "Lora Name"}},
        "required": ["lora_name"],
    },
}
_REQUEST_BODIES = {
    "/v1/load_lora_adapter": "LoadLoRAAdapterRequest",
    "/v1/unload_lora_adapter": "UnloadLoRAAdapterRequest",
}


def _operation(path: str) -> dict[str, Any]:
    schema = _REQUEST_BODIES.get(path)
    if schema is None:
        return {}
    ref = {"$ref": f"#/components/schemas/{schema}"}
    return {"requestBody": {"content": {"application/json": {"schema": ref}}, "required": True}}


async def _openapi(request: web.Request) -> web.StreamResponse:
    paths: dict[str, dict[str, dict[str, Any]]] = {
        path: {method: _operation(path) for method in methods} for path, methods in ROUTES.items()
    }
    info = {"title": "nemogym_sdk.serve", "version": "0.1.0"}
    document = {
        "openapi": "3.1.0",
        "info": info,
        "paths": paths,
        "components": {"schemas": _SCHEMAS},
    }
    return web.json_response(document)


async def _chat(request: web.Request) -> web.StreamResponse:
    engine, body = request.app[ENGINE_KEY], await _body(request)
    return web.json_response(await request.app[WORKER_KEY].run(engine.chat, body))


async def _complete(request: web.Request) -> web.StreamResponse:
    engine, body = request.app[ENGINE_KEY], await _body(request)
    return web.json_response(await request.app[WORKER_KEY].run(engine.complete, body))


async def _tokenize(request: web.Request) -> web.StreamResponse:
    engine, body = request.app[ENGINE_KEY], await _body(request)
    return web.json_response(await request.app[WORKER_KEY].run(engine.tokenize, body))


async def _load_lora(request: web.Request) -> web.StreamResponse:
    engine, body = request.app[ENGINE_KEY], await _body(request)
    worker = request.app[WORKER_KEY]
    return web.Response(text=await worker.run(engine.load_lora, body, exclusive=True))


async def _unload_lora(request: web.Request) -> web.StreamResponse:
    engine, body = request.app[ENGINE_KEY], await _body(request)
    worker = request.app[WORKER_KEY]
    return web.Response(text=await worker.run(engine.unload_lora, body, exclusive=True))


def query_value(request: web.Request, name: str, what: str) -> str:
    """The query parameter ``name`` of ``request``; a 400 naming ``what`` it must hold when
    it is missing or empty."""
    value = request.query.get(name, "")
    if not value:
        raise BadRequestError(f"{request.path} needs ?{name}=<{what}>")
    return value


def session_key(request: web.Request) -> str:
    """The ``session_id`` of ``POST /finish_session?session_id=<key>``."""
    return query_value(request, SESSION_ID, "the group's key")


async def abort_episode(request: web.Request) -> web.StreamResponse:
    """The client gave up on an episode: its generation in flight stops, its later turns
    are refused (`nemogym_sdk.serve.episodes`)."""
    episode = query_value(request, EPISODE_ID_PARAM, "the episode's id")
    stopped = request.app[ENGINE_KEY].episodes.abandon(episode)
    return web.json_response({"status": "ok", EPISODE_ID_PARAM: episode, "stopped": stopped})


async def _metrics(request: web.Request) -> web.StreamResponse:
    """Counters in Prometheus' text format, as vLLM's ``/metrics``: tokens sampled, and the
    generations and turns of abandoned episodes stopped or refused."""
    engine = request.app[ENGINE_KEY]
    counters = {
        "generation_tokens": engine.local.generated_tokens,
        "aborted_generations": engine.episodes.aborted_generations,
        "refused_turns": engine.episodes.refused_turns,
    }
    text = "".join(
        f"# TYPE nemogym_serve_{name}_total counter\nnemogym_serve_{name}_total {value}\n"
        for name, value in counters.items()
    )
    return web.Response(text=text, content_type="text/plain")


async def _finish_session(request: web.Request) -> web.StreamResponse:
    """No router behind this server: a group's key has nothing to forget (the route is
    answered, so one client speaks to a single server and to a fleet alike)."""
    key = session_key(request)
    return web.json_response({"status": "ok", SESSION_ID: key, "router": False})


def create_app(engine: ServeEngine) -> web.Application:
    """Return the aiohttp application serving ``engine`` on vLLM's routes.

    With a `VllmBackend` the routes are those of `nemogym_sdk.serve.proxy_routes`.
    """
    app = web.Application(middlewares=[_errors], client_max_size=_MAX_BODY)
    app[ENGINE_KEY] = engine
    if engine.proxy is not None:
        from nemogym_sdk.serve.proxy_routes import add_proxy_routes

        add_proxy_routes(app, engine, engine.proxy)
        return app
    # Sampling calls share batches: a full batch and room beside it. Scripted answers are
    # scored one at a time.
    worker = _Worker(threads=engine.local.max_batch + 4 if engine.mode == "sample" else 1)
    app[WORKER_KEY] = worker
    app.router.add_get("/health", _health)
    app.router.add_get("/v1/models", _models)
    app.router.add_get("/openapi.json", _openapi)
    app.router.add_post("/v1/chat/completions", _chat)
    app.router.add_post("/v1/completions", _complete)
    app.router.add_post("/tokenize", _tokenize)
    app.router.add_post("/v1/load_lora_adapter", _load_lora)
    app.router.add_post("/v1/unload_lora_adapter", _unload_lora)
    app.router.add_post(ROUTER_FINISH_SESSION, _finish_session)
    app.router.add_post(ABORT_EPISODE_ROUTE, abort_episode)
    app.router.add_get("/metrics", _metrics)

    async def _shutdown(app: web.Application) -> None:
        worker.executor.shutdown(wait=True)

    app.on_cleanup.append(_shutdown)
    return app


@attrs.define(kw_only=True)
class RunningServer:
    """A server listening on the current event loop; ``await close()`` to stop it."""

    runner: web.AppRunner
    """The aiohttp runner."""
    host: str
    """Bound host."""
    port: int
    """Bound port (the real one when 0 was asked)."""

    @property
    def url(self) -> str:
        """``http://host:port`` (the root, where ``/tokenize`` lives)."""
        return base_url(self.host, default_port=self.port)

    @property
    def base_url(self) -> str:
        """``http://host:port/v1`` (what NeMo Gym's ``vllm_model`` takes as ``base_url``)."""
        return f"{self.url}/v1"

    async def close(self) -> None:
        """Stop listening and release the worker thread."""
        await self.runner.cleanup()


async def start_server(
    engine: ServeEngine, *, host: str = "127.0.0.1", port: int = 0
) -> RunningServer:
    """Start serving ``engine`` on ``host:port`` (0 = a free port) on the running loop."""
    runner = web.AppRunner(create_app(engine), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = int(runner.addresses[0][1]) if runner.addresses else port
    return RunningServer(runner=runner, host=host, port=bound)


class ServerThread:
    """Run the server on its own event loop in a daemon thread (for tests and notebooks).

    Use as a context manager, or call `start` and `stop`::

        with ServerThread(engine) as server:
            requests.post(f"{server.base_url}/chat/completions", json=...)
    """

    def __init__(self, engine: ServeEngine, *, host: str = "127.0.0.1", port: int = 0) -> None:
        """Prepare (not start) a server for ``engine``."""
        self.engine = engine
        self.host = host
        self.port = port
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: RunningServer | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None

    @property
    def url(self) -> str:
        """``http://host:port``."""
        return base_url(self.host, default_port=self.port)

    @property
    def base_url(self) -> str:
        """``http://host:port/v1``."""
        return f"{self.url}/v1"

    def start(self, timeout: float = 30.0) -> ServerThread:
        """Start the thread and wait until the socket is listening."""
        self._thread = threading.Thread(target=self._run, name="nemogym-serve-loop", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout):
            raise TimeoutError("nemogym_sdk.serve did not start in time")
        if self._error is not None:
            raise RuntimeError("nemogym_sdk.serve failed to start") from self._error
        return self

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            self._server = loop.run_until_complete(
                start_server(self.engine, host=self.host, port=self.port)
            )
            self.port = self._server.port
        except Exception as error:  # noqa: BLE001 - re-raised in the starting thread
            self._error = error
            self._ready.set()
            loop.close()
            return
        self._ready.set()
        try:
            loop.run_forever()
        finally:
            loop.run_until_complete(self._server.close())
            loop.close()

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the server and join the thread."""
        if self._loop is not None and self._thread is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout)

    def __enter__(self) -> ServerThread:
        return self.start() if self._thread is None else self

    def __exit__(self, *exc: object) -> None:
        self.stop()
