"""A sampler replica that refuses adapters on demand, in front of a real one (fault tests)."""

from __future__ import annotations

import json

import aiohttp
from aiohttp import web

from tests.fakes import FakeServer


class RefusingReplica:
    """Forwards every request to a real replica (``target``), except adapter loads it is
    told to refuse, as a replica out of adapter memory or with an unreadable path would:
    all of them while ``refuse`` is set, or, for each ``suffix: n`` of ``refusals``, the
    next ``n`` loads of a path that ends with ``suffix``."""

    def __init__(self, target: str) -> None:
        self.target = target.removesuffix("/v1")
        self.refuse = False
        self.refusals: dict[str, int] = {}
        self.refused = 0

    def _refuses(self, body: bytes) -> bool:
        if self.refuse:
            return True
        path = str(json.loads(body or b"{}").get("lora_path", ""))
        for suffix, left in self.refusals.items():
            if left > 0 and path.endswith(suffix):
                self.refusals[suffix] = left - 1
                return True
        return False

    def routes(self, server: FakeServer) -> list[web.RouteDef]:
        async def forward(request: web.Request) -> web.StreamResponse:
            body = await request.read()
            if request.path == "/v1/load_lora_adapter" and self._refuses(body):
                self.refused += 1
                error = {"message": "no room for another adapter (test fault)", "code": 400}
                return web.json_response({"error": error}, status=400)
            async with (
                aiohttp.ClientSession() as http,
                http.request(
                    request.method,
                    f"{self.target}{request.path_qs}",
                    data=body,
                    headers={"Content-Type": "application/json"},
                ) as answer,
            ):
                return web.Response(
                    body=await answer.read(), status=answer.status, content_type=answer.content_type
                )

        return [web.route("*", "/{tail:.*}", forward)]
