"""An instant, near-zero-CPU OpenAI-compatible model for NeMo Gym's ``vllm_model``.

For benchmarks that must measure the rollout machinery, not a model. Serves on 127.0.0.1
(an ephemeral port, printed as ``PORT <n>``):

- ``POST /v1/chat/completions``: answers at once, in training mode: ``choices[0].message``
  carries the token bundle NeMo Gym's ``vllm_model`` takes first (``prompt_token_ids``,
  ``generation_token_ids``, ``generation_log_probs``; ``reference/nemo_gym_protocol.md``
  §6.1, §7). The prompt of a later turn starts with the previous turn's ``prompt_token_ids
  + generation_token_ids`` (the assistant message NeMo Gym sends back carries them), then a
  few "environment" tokens per message after it: the on-policy splice of §6.2, so a parser
  finds every turn extending the history (no drift). When the request offers tools and no
  tool result has come back yet, the answer calls the first tool (arguments: a string per
  required property, ``"San Francisco"`` for ``city``); otherwise it answers in text.
  A request whose messages contain ``FAIL_MARKER`` gets HTTP 400 (a non-retryable backend
  error that is not a context-length overflow), to make an episode fail on purpose.
- ``GET /v1/models``: the served name (``gym env start``'s readiness probe).
- ``POST /tokenize``: a fallback NeMo Gym uses only when no inline token ids come back.

Everything an answer needs is precomputed; a request costs one ``orjson.loads`` of its body
and one ``orjson.dumps`` of the answer.

Usage: python benchmarks/model_standin.py [--model bench-model] [--prompt-tokens 512]
                                          [--generation-tokens 64]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import sys
import time
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parent))

from local_servers import serve_app

FAIL_MARKER = "__bench_fail__"
"""A message containing this text makes the stand-in answer HTTP 400."""

ENV_TOKENS_PER_MESSAGE = 12
"""Tokens the "chat template" adds for each message after the last tokenized assistant turn."""


def _ids(count: int, seed: int) -> list[int]:
    return [(7919 * i + seed) % 150_000 + 300 for i in range(count)]


class StandIn:
    """The answers: precomputed token lists, one counter."""

    def __init__(self, model: str, prompt_tokens: int, generation_tokens: int) -> None:
        self.model = model
        self.prompt = _ids(prompt_tokens, 1)
        self.env = _ids(ENV_TOKENS_PER_MESSAGE, 2)
        self.generations = [_ids(generation_tokens, 3 + turn) for turn in range(8)]
        self.logprobs = [round(-0.02 * (i % 37) - 0.001, 4) for i in range(generation_tokens)]
        self.counter = itertools.count()

    def prompt_ids(self, messages: list[dict[str, Any]]) -> tuple[list[int], int]:
        """The turn's prompt ids (spliced onto the last tokenized assistant turn) and the
        number of assistant turns before it."""
        turns = 0
        last = -1
        for index, message in enumerate(messages):
            if message.get("role") == "assistant":
                turns += 1
                if message.get("generation_token_ids") is not None:
                    last = index
        if last < 0:
            return list(self.prompt), turns
        previous = messages[last]
        prefix = list(previous["prompt_token_ids"]) + list(previous["generation_token_ids"])
        return prefix + self.env * (len(messages) - last - 1), turns

    def answer(self, body: dict[str, Any]) -> dict[str, Any]:
        messages = body.get("messages") or []
        prompt, turns = self.prompt_ids(messages)
        generation = self.generations[min(turns, len(self.generations) - 1)]
        tools = body.get("tools") or []
        message: dict[str, Any] = {"role": "assistant", "content": None}
        if tools and not any(m.get("role") == "tool" for m in messages):
            function = tools[0].get("function", tools[0])
            required = (function.get("parameters") or {}).get("required") or []
            arguments = {k: "San Francisco" if k == "city" else "x" for k in required}
            message["tool_calls"] = [
                {
                    "id": f"call_{next(self.counter)}",
                    "type": "function",
                    "function": {
                        "name": function["name"],
                        "arguments": orjson.dumps(arguments).decode(),
                    },
                }
            ]
            finish = "tool_calls"
        else:
            message["content"] = "It is cold in San Francisco."
            finish = "stop"
        message["prompt_token_ids"] = prompt
        message["generation_token_ids"] = generation
        message["generation_log_probs"] = self.logprobs
        return {
            "id": f"chatcmpl-{next(self.counter)}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model", self.model),
            "choices": [
                {"index": 0, "message": message, "finish_reason": finish, "logprobs": None}
            ],
            "usage": {
                "prompt_tokens": len(prompt),
                "completion_tokens": len(generation),
                "total_tokens": len(prompt) + len(generation),
            },
        }


def make_app(stand_in: StandIn) -> web.Application:
    async def chat(request: web.Request) -> web.Response:
        raw = await request.read()
        if FAIL_MARKER.encode() in raw:
            error = {"error": {"message": "the stand-in refuses this row (benchmark failure)"}}
            return web.Response(
                body=orjson.dumps(error), status=400, content_type="application/json"
            )
        body = orjson.loads(raw)
        return web.Response(
            body=orjson.dumps(stand_in.answer(body)), content_type="application/json"
        )

    async def models(_: web.Request) -> web.Response:
        data = {"object": "list", "data": [{"id": stand_in.model, "object": "model"}]}
        return web.Response(body=orjson.dumps(data), content_type="application/json")

    async def tokenize(request: web.Request) -> web.Response:
        body = orjson.loads(await request.read())
        prompt, _ = stand_in.prompt_ids(body.get("messages") or [])
        data = {"tokens": prompt, "count": len(prompt)}
        return web.Response(body=orjson.dumps(data), content_type="application/json")

    app = web.Application(client_max_size=256 * 1024**2)
    app.add_routes(
        [
            web.post("/v1/chat/completions", chat),
            web.get("/v1/models", models),
            web.post("/tokenize", tokenize),
        ]
    )
    return app


async def _serve(args: argparse.Namespace) -> None:
    stand_in = StandIn(args.model, args.prompt_tokens, args.generation_tokens)
    await serve_app(make_app(stand_in), args.port, backlog=4096)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--model", default="bench-model")
    parser.add_argument("--prompt-tokens", type=int, default=512)
    parser.add_argument("--generation-tokens", type=int, default=64)
    return parser.parse_args(argv)


if __name__ == "__main__":
    asyncio.run(_serve(parse_args()))
