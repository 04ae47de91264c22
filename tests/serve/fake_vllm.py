"""A fake vLLM server on loopback, answering with vLLM 0.32's shapes (reference/vllm_cpu.md §6-§8).

``/v1/completions`` answers a token-id prompt with a scripted generation (``FakeVllm.script``,
cut at ``max_tokens``, stopped early at an EOS unless ``ignore_eos``), every token spelled
``token_id:<id>`` with logprob ``-0.25 * (position + 1)``, and top logprobs that depend on the
temperature only in ``processed_logprobs`` mode (so the proxy's mode probe can tell them
apart). LoRA routes keep adapters by name and ``/v1/models`` lists them. Every request body is
kept in ``requests`` for assertions.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from aiohttp import web

EOS = 258


def _error(message: str, status: int, err_type: str) -> web.Response:
    body = {"error": {"message": message, "type": err_type, "param": None, "code": status}}
    return web.json_response(body, status=status)


class FakeVllm:
    """A fake vLLM OpenAI server in a background thread (``with FakeVllm(...) as fake``)."""

    def __init__(
        self,
        script: list[int],
        *,
        served_name: str = "tiny",
        logprobs_mode: str = "raw_logprobs",
        max_model_len: int = 2048,
    ) -> None:
        self.script = script
        self.served_name = served_name
        self.logprobs_mode = logprobs_mode
        self.max_model_len = max_model_len
        self.adapters: dict[str, str] = {}
        self.requests: list[tuple[str, Any]] = []
        self.port = 0
        self.misspell = False
        self.delay = 0.0
        """Seconds a completion takes before it is answered."""
        self.abandoned = 0
        """Completions whose client had closed the connection by the time they were done."""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def completions(self) -> list[Any]:
        """The ``/v1/completions`` bodies received, the mode probe's left out."""
        return [b for p, b in self.requests if p == "/v1/completions" and b.get("max_tokens") != 1]

    # ------------------------------------------------------------------ handlers

    async def _models(self, request: web.Request) -> web.Response:
        cards = [{"id": self.served_name, "object": "model", "root": "/m", "parent": None}]
        cards[0]["max_model_len"] = self.max_model_len
        for name, path in self.adapters.items():
            cards.append({"id": name, "object": "model", "root": path, "parent": self.served_name})
        return web.json_response({"object": "list", "data": cards})

    async def _completions(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.requests.append(("/v1/completions", body))
        if self.delay and body.get("max_tokens") != 1:
            await asyncio.sleep(self.delay)
            if request.transport is None or request.transport.is_closing():
                self.abandoned += 1  # vLLM aborts such a request
        model = body.get("model")
        if model != self.served_name and model not in self.adapters:
            return _error(f"The model `{model}` does not exist.", 404, "NotFoundError")
        prompt = body["prompt"]
        if len(prompt) + body["max_tokens"] > self.max_model_len:
            return _error(
                f"This model's maximum context length is {self.max_model_len} tokens.",
                400,
                "BadRequestError",
            )
        out: list[int] = []
        for token in self.script[: body["max_tokens"]]:
            out.append(token)
            if token == EOS and not body.get("ignore_eos"):
                break
        finish = "stop" if out and out[-1] == EOS else "length"
        temperature = float(body.get("temperature", 1.0))
        k = int(body.get("logprobs") or 0)

        def top(position: int, token: int) -> dict[str, float]:
            scale = 1.0 / temperature if self.logprobs_mode == "processed_logprobs" else 1.0
            entries = {f"token_id:{token}": -0.25 * (position + 1)}
            for alt in range(k):
                entries[f"token_id:{alt}"] = -1.0 * (alt + 1) * scale
            return entries

        spelled = [f"token_id:{t}" for t in out]
        if self.misspell and spelled:
            spelled[0] = "token_id:999"
        choice = {
            "index": 0,
            "text": "",
            "logprobs": {
                "text_offset": list(range(len(out))),
                "token_logprobs": [-0.25 * (i + 1) for i in range(len(out))],
                "tokens": spelled,
                "top_logprobs": [top(i, t) for i, t in enumerate(out)],
            },
            "finish_reason": finish,
            "stop_reason": None,
            "prompt_logprobs": None,
            "prompt_token_ids": prompt,
            "token_ids": out,
        }
        return web.json_response(
            {
                "id": "cmpl-fake",
                "object": "text_completion",
                "model": model,
                "choices": [choice],
                "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(out)},
            }
        )

    async def _load(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.requests.append(("/v1/load_lora_adapter", body))
        name = body["lora_name"]
        if name in self.adapters and not body.get("load_inplace"):
            return _error(
                f"The lora adapter '{name}' has already been loaded.", 400, "InvalidUserInput"
            )
        self.adapters[name] = body["lora_path"]
        return web.Response(text=f"Success: LoRA adapter '{name}' added successfully.")

    async def _unload(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.requests.append(("/v1/unload_lora_adapter", body))
        if self.adapters.pop(body["lora_name"], None) is None:
            return _error("The lora adapter cannot be found.", 404, "NotFoundError")
        return web.Response(text=f"Success: LoRA adapter '{body['lora_name']}' removed.")

    async def _openapi(self, request: web.Request) -> web.Response:
        paths = {"/v1/load_lora_adapter": {"post": {}}, "/v1/unload_lora_adapter": {"post": {}}}
        return web.json_response({"openapi": "3.1.0", "paths": paths})

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    # ------------------------------------------------------------------ lifecycle

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        app = web.Application()
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_post("/v1/load_lora_adapter", self._load)
        app.router.add_post("/v1/unload_lora_adapter", self._unload)
        app.router.add_get("/openapi.json", self._openapi)
        app.router.add_get("/health", self._health)
        self._runner = web.AppRunner(app, access_log=None)
        loop.run_until_complete(self._runner.setup())
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        loop.run_until_complete(site.start())
        self.port = int(self._runner.addresses[0][1])
        self._ready.set()
        try:
            loop.run_forever()
        finally:
            loop.run_until_complete(self._runner.cleanup())
            loop.close()

    def __enter__(self) -> FakeVllm:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        assert self._ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._loop is not None and self._thread is not None
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
