"""probe_lora_support: routes from /openapi.json, adapters from /v1/models, never a POST.

``FakeVLLM`` (also used by ``test_lora_sync.py``) is a small stand-in for vLLM's LoRA
routes with a request log; the real-server cases use ``nemogym_sdk.serve`` on loopback.
"""

from __future__ import annotations

import json
import pickle
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace
from typing import Any
from unittest.mock import MagicMock

import attrs
import pytest
import requests

from nemogym_sdk.errors import DeadlineError, ServerError, TransportError
from nemogym_sdk.hosts import server_root
from nemogym_sdk.lora import LoraCapabilities, LoraSyncError, probe_lora_support
from nemogym_sdk.lora.probe import server_message
from nemogym_sdk.processes import free_loopback_ports

BASE = "base-model"

LOAD_SCHEMA = {
    "type": "object",
    "properties": {
        "lora_name": {"type": "string"},
        "lora_path": {"type": "string"},
        "load_inplace": {"type": "boolean", "default": False},
        "is_3d_lora_weight": {"type": "boolean", "default": False},
    },
    "required": ["lora_name", "lora_path"],
}


def openapi(*, inplace: bool = True, lora: bool = True) -> dict[str, Any]:
    """An /openapi.json shaped like vLLM's (FastAPI: ``$ref`` into components)."""
    schema = dict(LOAD_SCHEMA)
    if not inplace:
        schema["properties"] = {
            k: v for k, v in LOAD_SCHEMA["properties"].items() if k != "load_inplace"
        }
    ref = {"$ref": "#/components/schemas/LoadLoRAAdapterRequest"}
    paths: dict[str, Any] = {
        "/health": {"get": {}},
        "/v1/models": {"get": {}},
        "/v1/chat/completions": {"post": {}},
    }
    if lora:
        paths["/v1/load_lora_adapter"] = {
            "post": {"requestBody": {"content": {"application/json": {"schema": ref}}}}
        }
        paths["/v1/unload_lora_adapter"] = {"post": {}}
    return {
        "openapi": "3.1.0",
        "paths": paths,
        "components": {"schemas": {"LoadLoRAAdapterRequest": schema}},
    }


@attrs.define
class FakeVLLM:
    """vLLM's model and LoRA routes in memory, with knobs for each failure mode.

    ``fail_next`` = (status, message) makes the next load fail; with ``mutate_on_failure``
    a failed in-place load still records the new path as the card's root, as vLLM does.
    ``ignore_loads`` answers 200 without loading (a server that lies).
    """

    openapi: dict[str, Any] | None = attrs.Factory(openapi)
    adapters: dict[str, str] = attrs.Factory(dict)
    log: list[tuple[str, str, Any]] = attrs.Factory(list)
    error_style: str = "nested"
    fail_next: tuple[int, str] | None = None
    mutate_on_failure: bool = False
    ignore_loads: bool = False
    api_key: str | None = None
    delay_s: float = 0.0
    server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def posts(self) -> list[tuple[str, Any]]:
        """(path, body) of every POST, in order."""
        return [(path, body) for method, path, body in self.log if method == "POST"]

    def error(self, status: int, message: str) -> tuple[int, Any]:
        if self.error_style == "nested":
            return status, {"error": {"message": message, "type": "BadRequestError"}}
        if self.error_style == "flat":  # vLLM before 0.9: a flat ErrorResponse
            return status, {"object": "error", "message": message, "code": status}
        return status, message

    def handle(self, method: str, path: str, body: Any, headers: Any) -> tuple[int, Any]:
        self.log.append((method, path, body))
        time.sleep(self.delay_s)
        authorized = headers.get("Authorization") == f"Bearer {self.api_key}"
        if self.api_key and path.startswith("/v1") and not authorized:
            return self.error(401, "Unauthorized")
        if method == "GET" and path == "/openapi.json":
            return (
                (200, self.openapi) if self.openapi is not None else (404, {"detail": "Not Found"})
            )
        if method == "GET" and path == "/v1/models":
            cards = [{"id": BASE, "root": "/models/base", "parent": None}]
            cards += [{"id": n, "root": p, "parent": BASE} for n, p in self.adapters.items()]
            return 200, {"object": "list", "data": cards}
        lora = self.openapi is None or "/v1/load_lora_adapter" in self.openapi["paths"]
        if method == "POST" and path == "/v1/load_lora_adapter" and lora:
            name, where = body["lora_name"], body["lora_path"]
            if name in self.adapters and not body.get("load_inplace"):
                return self.error(400, f"The lora adapter '{name}' has already been loaded.")
            if self.fail_next is not None:
                status, message = self.fail_next
                self.fail_next = None
                if self.mutate_on_failure and name in self.adapters:
                    self.adapters[name] = where
                return self.error(status, message)
            if not self.ignore_loads:
                self.adapters[name] = where
            return 200, f"Success: LoRA adapter '{name}' added successfully."
        if method == "POST" and path == "/v1/unload_lora_adapter" and lora:
            name = body["lora_name"]
            if name not in self.adapters:
                return self.error(404, f"The lora adapter '{name}' cannot be found.")
            del self.adapters[name]
            return 200, f"Success: LoRA adapter '{name}' removed successfully."
        return 404, {"detail": "Not Found"}

    def start(self) -> FakeVLLM:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self, method: str) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                body = json.loads(raw) if raw else None
                status, payload = fake.handle(method, self.path, body, self.headers)
                data = (
                    payload.encode() if isinstance(payload, str) else json.dumps(payload).encode()
                )
                kind = "text/plain" if isinstance(payload, str) else "application/json"
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", kind)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (the timeout test)

            def do_GET(self) -> None:
                self._answer("GET")

            def do_POST(self) -> None:
                self._answer("POST")

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        ).start()
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()


@pytest.fixture
def fake() -> Iterator[FakeVLLM]:
    """A FakeVLLM with vLLM's routes and in-place support, on a loopback port."""
    server = FakeVLLM().start()
    yield server
    server.stop()


# --- real server ----------------------------------------------------------------------------


def test_probe_reads_our_server_and_its_load_schema(tmp_path: Any) -> None:
    """Our server: both routes, in-place loads (from its schema), adapters with their roots."""
    pytest.importorskip("peft")
    from .serve.conftest import make_server, save_random_lora

    server = make_server("sample")
    try:
        doc = requests.get(f"{server.url}/openapi.json", timeout=10).json()
        schema = doc["components"]["schemas"]["LoadLoRAAdapterRequest"]
        assert set(schema["properties"]) == {"lora_name", "lora_path", "load_inplace"}
        assert schema["properties"]["load_inplace"]["default"] is False
        caps = probe_lora_support(server.base_url)
        assert caps is not None
        assert (caps.routes_known, caps.can_load, caps.can_unload, caps.inplace) == (
            True,
            True,
            True,
            True,
        )
        assert caps.supports_lora and caps.why_not() is None
        assert caps.models == ("tiny",) and caps.adapters == {}
        assert caps.base_url == server.url

        adapter = save_random_lora(tmp_path / "a", 1)
        body = {"lora_name": "policy", "lora_path": str(adapter)}
        assert requests.post(f"{server.base_url}/load_lora_adapter", json=body, timeout=60).ok
        again = probe_lora_support(server.url)
        assert again is not None
        assert again.adapters == {"policy": str(adapter)}
        assert again.models == ("tiny", "policy") and again.base_models == ("tiny",)
    finally:
        server.stop()


# --- fake servers ---------------------------------------------------------------------------


def test_probe_never_posts_and_follows_the_schema_ref(fake: FakeVLLM) -> None:
    """vLLM's shape: ``load_inplace`` behind a ``$ref``; only two GETs are sent."""
    fake.adapters["policy"] = "/ckpt/v3"
    caps = probe_lora_support(f"{fake.url}/v1/")
    assert caps is not None
    assert caps.inplace and caps.can_load and caps.can_unload and caps.supports_lora
    assert caps.adapters == {"policy": "/ckpt/v3"}
    assert "/v1/load_lora_adapter" in caps.routes
    assert [(m, p) for m, p, _ in fake.log] == [("GET", "/openapi.json"), ("GET", "/v1/models")]


def test_probe_sees_a_load_route_without_load_inplace(fake: FakeVLLM) -> None:
    """A load schema without ``load_inplace``: supported, replaced by unload then load."""
    fake.openapi = openapi(inplace=False)
    caps = probe_lora_support(fake.url)
    assert caps is not None
    assert caps.can_load and caps.can_unload and not caps.inplace
    assert caps.supports_lora
    assert fake.posts() == []


def test_probe_reads_allof_schemas(fake: FakeVLLM) -> None:
    """A request schema composed with ``allOf`` still reveals ``load_inplace``."""
    doc = openapi()
    doc["components"]["schemas"]["Wrapper"] = {
        "allOf": [{"$ref": "#/components/schemas/LoadLoRAAdapterRequest"}]
    }
    operation = doc["paths"]["/v1/load_lora_adapter"]["post"]
    operation["requestBody"]["content"]["application/json"]["schema"] = {
        "$ref": "#/components/schemas/Wrapper"
    }
    fake.openapi = doc
    caps = probe_lora_support(fake.url)
    assert caps is not None and caps.inplace


def test_probe_without_openapi_knows_no_routes(fake: FakeVLLM) -> None:
    """No /openapi.json: routes unknown (not missing), and why_not says both things."""
    fake.openapi = None
    caps = probe_lora_support(fake.url)
    assert caps is not None
    assert not caps.routes_known and not caps.supports_lora
    assert caps.routes_error is not None and "404" in caps.routes_error
    why = caps.why_not()
    assert why is not None
    assert "unknown" in why and "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True" in why
    assert caps.models == (BASE,)


def test_probe_without_lora_routes_says_how_to_enable_them(fake: FakeVLLM) -> None:
    """A vLLM started without runtime LoRA: the sentence names the env var and both flags."""
    fake.openapi = openapi(lora=False)
    caps = probe_lora_support(fake.url)
    assert caps is not None
    assert caps.routes_known and not caps.can_load and not caps.supports_lora
    why = caps.why_not()
    assert why is not None
    for needed in ("VLLM_ALLOW_RUNTIME_LORA_UPDATING=True", "--enable-lora", "--max-lora-rank"):
        assert needed in why
    assert fake.posts() == []


def test_probe_load_route_that_cannot_replace(fake: FakeVLLM) -> None:
    """Load without ``load_inplace`` and without unload: an adapter could never be replaced."""
    doc = openapi(inplace=False)
    del doc["paths"]["/v1/unload_lora_adapter"]
    fake.openapi = doc
    caps = probe_lora_support(fake.url)
    assert caps is not None and caps.can_load and not caps.supports_lora
    assert "never be replaced" in (caps.why_not() or "")


def test_probe_with_api_key(fake: FakeVLLM) -> None:
    """--api-key servers: /v1/models needs the bearer token; the error says so."""
    fake.api_key = "secret"
    with pytest.raises(LoraSyncError) as info:
        probe_lora_support(fake.url)
    assert info.value.status == 401 and info.value.server_message == "Unauthorized"
    assert "api_key" in str(info.value)
    caps = probe_lora_support(fake.url, api_key="secret")
    assert caps is not None and caps.models == (BASE,)


def test_probe_unreachable_and_slow_servers() -> None:
    """Nothing listening: TransportError. No answer in time: DeadlineError."""
    with pytest.raises(TransportError, match="cannot reach"):
        probe_lora_support(f"http://127.0.0.1:{free_loopback_ports(1)[0]}", timeout=2)
    slow = FakeVLLM(delay_s=1.0).start()
    try:
        with pytest.raises(DeadlineError, match="timeout"):
            probe_lora_support(slow.url, timeout=0.2)
    finally:
        slow.stop()


def test_probe_targets(fake: FakeVLLM) -> None:
    """Generation objects: a client with base_url is probed; no client (rank > 0) is None."""
    assert probe_lora_support(SimpleNamespace()) is None
    assert probe_lora_support(MagicMock(spec=[])) is None
    assert probe_lora_support(MagicMock()) is None  # attributes that are not URLs
    assert probe_lora_support(SimpleNamespace(vllm_client=None)) is None
    assert fake.log == []
    client = SimpleNamespace(base_url=fake.url)
    caps = probe_lora_support(SimpleNamespace(vllm_client=client))
    assert caps is not None and caps.base_url == fake.url
    port = int(fake.url.rsplit(":", 1)[1])
    legacy = SimpleNamespace(vllm_client=SimpleNamespace(host="127.0.0.1", server_port=port))
    legacy_caps = probe_lora_support(legacy)
    assert legacy_caps is not None and legacy_caps.base_url == fake.url


def test_server_root_normalises_urls() -> None:
    """With or without /v1, trailing slashes, a bare host:port, a wildcard host."""
    expected = "http://127.0.0.1:8000"
    for url in (
        "http://127.0.0.1:8000",
        "http://127.0.0.1:8000/",
        "http://127.0.0.1:8000/v1",
        "http://127.0.0.1:8000/v1/",
        "127.0.0.1:8000",
        "0.0.0.0:8000/v1",
    ):
        assert server_root(url) == expected
    assert server_root("https://gw.example/vllm/v1") == "https://gw.example/vllm"
    with pytest.raises(ValueError):
        server_root("ftp://x:1")


def _response(status: int, content: bytes) -> requests.Response:
    response = requests.Response()
    response.status_code = status
    response._content = content
    response.reason = "Bad Request"
    return response


def test_server_message_shapes() -> None:
    """vLLM's nested error, old vLLM's flat error, FastAPI's detail, plain text, nothing."""
    nested = b'{"error": {"message": "Invalid LoRA adapter", "type": "BadRequestError"}}'
    assert server_message(_response(400, nested)) == "Invalid LoRA adapter"
    assert server_message(_response(400, b'{"object": "error", "message": "m"}')) == "m"
    assert server_message(_response(404, b'{"detail": "Not Found"}')) == "Not Found"
    assert server_message(_response(422, b'{"detail": [{"loc": ["body"]}]}')).startswith("[{")
    assert server_message(_response(500, b"Worker failed")) == "Worker failed"
    assert server_message(_response(400, b"")) == "HTTP 400 Bad Request"


def test_lora_sync_error_is_a_server_error_and_pickles() -> None:
    """One tree: LoraSyncError is a ServerError; its fields survive pickling."""
    error = LoraSyncError("load failed", 400, "{...}", "Invalid LoRA adapter")
    assert isinstance(error, ServerError)
    back = pickle.loads(pickle.dumps(error))
    assert (str(back), back.status, back.body, back.server_message) == (
        "load failed",
        400,
        "{...}",
        "Invalid LoRA adapter",
    )


def test_capabilities_record_is_frozen() -> None:
    """LoraCapabilities is an immutable record."""
    caps = LoraCapabilities(base_url="http://h:1", routes_known=True)
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        caps.inplace = True  # type: ignore[misc]
