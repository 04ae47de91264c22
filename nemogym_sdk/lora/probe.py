"""What an inference server can do with runtime LoRA adapters, found without side effects.

``probe_lora_support`` reads two routes and nothing else:

- ``GET /openapi.json``: is there ``POST /v1/load_lora_adapter`` and
  ``POST /v1/unload_lora_adapter``, and does the load request's schema have a
  ``load_inplace`` property (vLLM's ``LoadLoRAAdapterRequest``)?
- ``GET /v1/models``: which ids are served, and which of them are adapters (cards whose
  ``parent`` is set; their ``root`` is the path they were loaded from).

It never loads a bogus adapter to find out (axolotl's probe does, against production
servers: W-NET-6). A server that does not publish ``/openapi.json`` is not an error: its
routes are "unknown" (``routes_known=False``) and ``LoraSync`` then replaces an adapter
by unloading and loading it, saying so in a log line. A server that cannot be reached is a
``TransportError``; one that does not answer in time is a ``DeadlineError``.

Requests go through ``nemogym_sdk._net.http``, where ``requests``' exceptions become the SDK's.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import attrs
import requests

from nemogym_sdk._net.http import owned_session, send, server_message
from nemogym_sdk.errors import LoraSyncError
from nemogym_sdk.hosts import server_root

__all__ = [
    "ENABLE_RUNTIME_LORA",
    "LOAD_ROUTE",
    "UNLOAD_ROUTE",
    "LoraCapabilities",
    "LoraSyncError",
    "probe_lora_support",
    "server_root",
]

logger = logging.getLogger(__name__)

LOAD_ROUTE = "/v1/load_lora_adapter"
UNLOAD_ROUTE = "/v1/unload_lora_adapter"
MODELS_ROUTE = "/v1/models"
OPENAPI_ROUTE = "/openapi.json"

ENABLE_RUNTIME_LORA = (
    "To serve adapters that change at runtime, start vLLM with "
    "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True in its environment and the flags "
    "--enable-lora --max-lora-rank N (N at least the adapter's r: 8, 16, 32, 64 ...)."
)
"""How to enable vLLM's runtime LoRA routes (used in error messages)."""

_MAX_BODY = 2000


@attrs.frozen(kw_only=True)
class LoraCapabilities:
    """What an inference server offers for runtime LoRA, as read from its routes."""

    base_url: str
    """Server root, ``http://host:port`` (no ``/v1``)."""
    routes_known: bool
    """Whether ``/openapi.json`` was read; when False the route flags below are False
    because nothing is known, not because the routes are missing."""
    routes: frozenset[str] = frozenset()
    """Every path ``/openapi.json`` lists."""
    can_load: bool = False
    """``POST /v1/load_lora_adapter`` is listed."""
    can_unload: bool = False
    """``POST /v1/unload_lora_adapter`` is listed."""
    inplace: bool = False
    """The load request schema has ``load_inplace``: an adapter can be replaced under its
    name without a moment in which the name is missing."""
    models: tuple[str, ...] = ()
    """Every id ``/v1/models`` lists, in its order (base models and adapters)."""
    adapters: Mapping[str, str] = attrs.field(factory=dict, hash=False)
    """Loaded adapters: name -> the path (``root``) they were loaded from."""
    routes_error: str | None = None
    """Why ``/openapi.json`` could not be read, when it could not."""

    @property
    def base_models(self) -> tuple[str, ...]:
        """Served ids that are not adapters."""
        return tuple(m for m in self.models if m not in self.adapters)

    @property
    def supports_lora(self) -> bool:
        """Known to load adapters at runtime and to replace them (in place or by unloading)."""
        return self.can_load and (self.inplace or self.can_unload)

    def why_not(self) -> str | None:
        """``None`` when ``supports_lora``; otherwise what is missing and how to fix it."""
        if self.supports_lora:
            return None
        if not self.routes_known:
            return (
                f"{self.base_url}{OPENAPI_ROUTE} could not be read ({self.routes_error}), so "
                f"whether the server has runtime LoRA routes is unknown. {ENABLE_RUNTIME_LORA}"
            )
        if not self.can_load:
            return f"{self.base_url} does not list POST {LOAD_ROUTE}. {ENABLE_RUNTIME_LORA}"
        return (
            f"{self.base_url} lists POST {LOAD_ROUTE} but neither 'load_inplace' nor POST "
            f"{UNLOAD_ROUTE}, so a loaded adapter can never be replaced. Use a vLLM release "
            "whose LoadLoRAAdapterRequest has 'load_inplace'."
        )


# --- URLs ---------------------------------------------------------------------------------


def target_url(target: object) -> str | None:
    """The server root of ``target``: a URL, or an object holding a vLLM client.

    TRL's ``VLLMGeneration`` has a ``vllm_client`` (with ``base_url``) only on the main
    process; an object without one gives ``None``.
    """
    if isinstance(target, str):
        return server_root(target)
    client = getattr(target, "vllm_client", None)
    source = client if client is not None else target
    url = getattr(source, "base_url", None)
    if isinstance(url, str) and url:
        return server_root(url)
    host, port = getattr(source, "host", None), getattr(source, "server_port", None)
    if isinstance(host, str) and isinstance(port, int):
        return server_root(f"{host}:{port}")
    return None


# --- HTTP (through nemogym_sdk._net.http, the one edge where requests' exceptions are translated)


def request(
    http: requests.Session,
    method: str,
    url: str,
    *,
    timeout: float,
    headers: Mapping[str, str],
    body: Mapping[str, Any] | None = None,
) -> requests.Response:
    """``_net.http.send`` with hints for an inference server (is it running? is it busy?)."""
    return send(
        http,
        method,
        url,
        timeout=timeout,
        headers=headers,
        body=body,
        hint=(
            "Is the inference server running at that address? Pass a larger timeout if it is "
            "busy (loading a large adapter takes a while)."
        ),
    )


def read_models(
    http: requests.Session, root: str, *, timeout: float, headers: Mapping[str, str]
) -> list[Mapping[str, Any]]:
    """The model cards of ``GET /v1/models``; ``LoraSyncError`` if it fails or is malformed."""
    url = f"{root}{MODELS_ROUTE}"
    response = request(http, "GET", url, timeout=timeout, headers=headers)
    if response.status_code >= 400:
        message = server_message(response)
        hint = " (pass api_key= if the server was started with --api-key)" * (
            response.status_code in (401, 403)
        )
        raise LoraSyncError(
            f"GET {url} answered HTTP {response.status_code}: {message}{hint}",
            response.status_code,
            response.text[:_MAX_BODY],
            message,
        )
    try:
        data = response.json().get("data")
    except (ValueError, AttributeError):
        data = None
    if not isinstance(data, list):
        raise LoraSyncError(
            f"GET {url} did not return a model list: {response.text[:200]!r}",
            0,
            response.text[:_MAX_BODY],
        )
    return [card for card in data if isinstance(card, Mapping)]


def adapter_roots(cards: list[Mapping[str, Any]]) -> dict[str, str]:
    """Adapters among model cards (``parent`` set): id -> ``root``."""
    return {
        str(card["id"]): str(card.get("root") or "")
        for card in cards
        if card.get("parent") and isinstance(card.get("id"), str)
    }


# --- openapi ------------------------------------------------------------------------------


def _schema_properties(doc: Mapping[str, Any], schema: Any, depth: int = 0) -> set[str]:
    """Property names of a JSON schema, following local ``$ref`` and ``allOf``/``anyOf``."""
    if not isinstance(schema, Mapping) or depth > 8:
        return set()
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/"):
        node: Any = doc
        for part in ref[2:].split("/"):
            node = node.get(part) if isinstance(node, Mapping) else None
        return _schema_properties(doc, node, depth + 1)
    found = set(schema.get("properties") or {}) if isinstance(schema, Mapping) else set()
    for key in ("allOf", "anyOf", "oneOf"):
        for member in schema.get(key) or ():
            found |= _schema_properties(doc, member, depth + 1)
    return found


def _load_properties(doc: Mapping[str, Any], operation: Any) -> set[str]:
    if not isinstance(operation, Mapping):
        return set()
    body = operation.get("requestBody")
    content = body.get("content") if isinstance(body, Mapping) else None
    media = content.get("application/json") if isinstance(content, Mapping) else None
    schema = media.get("schema") if isinstance(media, Mapping) else None
    return _schema_properties(doc, schema)


def _read_openapi(
    http: requests.Session, root: str, *, timeout: float, headers: Mapping[str, str]
) -> tuple[Mapping[str, Any] | None, str | None]:
    """The openapi document, or None and why not (a missing document is not an error)."""
    url = f"{root}{OPENAPI_ROUTE}"
    response = request(http, "GET", url, timeout=timeout, headers=headers)
    if response.status_code >= 400:
        return None, f"HTTP {response.status_code}: {server_message(response)[:200]}"
    try:
        doc = response.json()
    except ValueError:
        return None, "the answer is not JSON"
    if not isinstance(doc, Mapping) or not isinstance(doc.get("paths"), Mapping):
        return None, "the answer has no 'paths'"
    return doc, None


def probe_lora_support(
    target: object,
    *,
    timeout: float = 5.0,
    api_key: str | None = None,
    session: requests.Session | None = None,
) -> LoraCapabilities | None:
    """Read what ``target``'s inference server offers for runtime LoRA; load nothing.

    Args:
        target: the server as ``http://host:port`` or ``http://host:port/v1``, or a
            trainer-side generation object holding a vLLM client (TRL's
            ``VLLMGeneration.vllm_client.base_url``).
        timeout: seconds per request.
        api_key: bearer token, when the server was started with ``--api-key``.
        session: a ``requests.Session`` to reuse.

    Returns:
        The capabilities, or ``None`` when ``target`` holds no client (on ranks other
        than the main process); never raises in that case.

    Raises:
        TransportError: the server cannot be reached.
        DeadlineError: it did not answer within ``timeout``.
        LoraSyncError: ``GET /v1/models`` failed (e.g. 401 without the API key).
    """
    root = target_url(target)
    if root is None:
        logger.debug("no vLLM client on %r (not the main process): LoRA probe skipped", target)
        return None
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    with owned_session(session) as http:
        doc, routes_error = _read_openapi(http, root, timeout=timeout, headers=headers)
        cards = read_models(http, root, timeout=timeout, headers=headers)
    models = tuple(str(card["id"]) for card in cards if isinstance(card.get("id"), str))
    adapters = adapter_roots(cards)
    if doc is None:
        logger.info("LoRA routes of %s unknown: %s%s unreadable", root, root, OPENAPI_ROUTE)
        return LoraCapabilities(
            base_url=root,
            routes_known=False,
            models=models,
            adapters=adapters,
            routes_error=routes_error,
        )
    paths: Mapping[str, Any] = doc["paths"]

    def post(route: str) -> Any:
        entry = paths.get(route)
        return entry.get("post") if isinstance(entry, Mapping) else None

    load = post(LOAD_ROUTE)
    return LoraCapabilities(
        base_url=root,
        routes_known=True,
        routes=frozenset(str(p) for p in paths),
        can_load=load is not None,
        can_unload=post(UNLOAD_ROUTE) is not None,
        inplace="load_inplace" in _load_properties(doc, load),
        models=models,
        adapters=adapters,
    )
