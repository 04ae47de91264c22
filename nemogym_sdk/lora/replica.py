"""``AdapterServer``: one inference server ``LoraSync`` publishes to, and what it holds.

``LoraSync`` publishes every version to each of its servers (one sampler, or several replicas
of one policy); this module is the part that talks to one of them: its LoRA capabilities
(probed once), whether the adapter's name is loaded there, the load (in place, or unload
then load), the confirmation through ``GET /v1/models``, and, after a failure, loading the
last confirmed version again. Errors name the server when there are several.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import requests

from nemogym_sdk._net.http import server_message
from nemogym_sdk.errors import LoraSyncError, NemoGymError
from nemogym_sdk.lora.probe import (
    ENABLE_RUNTIME_LORA,
    LOAD_ROUTE,
    UNLOAD_ROUTE,
    LoraCapabilities,
    probe_lora_support,
    read_models,
    request,
)
from nemogym_sdk.wire import CARD_MAX_NUM_SEQS_FIELD, CARD_VERSIONS_KEPT_FIELD, LOAD_VERSION_FIELD

__all__ = ["AdapterServer", "Published", "root_of"]

logger = logging.getLogger(__name__)

_MAX_BODY = 2000

Published = tuple[int, str]
"""A confirmed version and the path it was loaded from."""


class AdapterServer:
    """One LoRA-capable inference server (vLLM, ``nemogym_sdk.serve``, or its proxy).

    Args:
        url: the server root, ``http://host:port``.
        adapter_name: the name the adapter is served under.
        http: the session to send with.
        timeout: seconds per request.
        headers: sent with every request (``Authorization``).
        label: how errors name it (``"replica http://..."`` when there are several; "" for
            the only one).
    """

    def __init__(
        self,
        url: str,
        adapter_name: str,
        *,
        http: requests.Session,
        timeout: float,
        headers: dict[str, str],
        label: str = "",
    ) -> None:
        self.url = url
        self.adapter_name = adapter_name
        self.label = label
        self.capabilities: LoraCapabilities | None = None
        """What it offers, once probed."""
        self.loaded: bool | None = None
        """Whether ``adapter_name`` is loaded there (None: not known yet)."""
        self._http = http
        self._timeout = timeout
        self._headers = headers
        self._api_key = headers.get("Authorization", "").removeprefix("Bearer ") or None
        self._told_unknown_routes = False

    def probe(self) -> LoraCapabilities:
        """Read its LoRA capabilities (loads nothing)."""
        caps = probe_lora_support(
            self.url, timeout=self._timeout, api_key=self._api_key, session=self._http
        )
        assert caps is not None  # a URL always gives capabilities
        self.capabilities = caps
        self.loaded = self.adapter_name in caps.adapters
        return caps

    def cards(self) -> list[Any]:
        """Its ``GET /v1/models`` cards."""
        return read_models(self._http, self.url, timeout=self._timeout, headers=self._headers)

    def served_root(self) -> str | None:
        """The path the adapter's card reports (None: not listed)."""
        return root_of(self.cards(), self.adapter_name)

    def versions_kept(self) -> int | None:
        """How many versions it keeps side by side (None: it does not say)."""
        card = next((c for c in self.cards() if c.get("id") == self.adapter_name), None)
        kept = None if card is None else card.get(CARD_VERSIONS_KEPT_FIELD)
        return kept if isinstance(kept, int) and not isinstance(kept, bool) else None

    def decode_capacity(self) -> int | None:
        """How many generations it decodes at once, from its base model's card (None: it
        does not say)."""
        card = next((c for c in self.cards() if not c.get("parent")), None)
        capacity = None if card is None else card.get(CARD_MAX_NUM_SEQS_FIELD)
        return capacity if isinstance(capacity, int) and not isinstance(capacity, bool) else None

    def _post(self, route: str, body: dict[str, Any]) -> requests.Response:
        return request(
            self._http,
            "POST",
            f"{self.url}{route}",
            timeout=self._timeout,
            headers=self._headers,
            body=body,
        )

    def load(self, path: Path, version: int, last: Published | None) -> bool:
        """Load ``path`` as ``version``; whether it was swapped in place. A refused load
        raises ``LoraSyncError`` after loading ``last`` again (saying whether that worked)."""
        caps = self.capabilities
        assert caps is not None
        loaded = bool(self.loaded)
        inplace = caps.inplace and loaded
        if loaded and not caps.inplace:
            if not caps.routes_known and not self._told_unknown_routes:
                self._told_unknown_routes = True
                logger.warning(
                    "%s/openapi.json unreadable (%s): replacing adapter %r by unload then load; "
                    "requests for it fail with 404 until the load completes",
                    self.url,
                    caps.routes_error,
                    self.adapter_name,
                )
            response = self._post(UNLOAD_ROUTE, {"lora_name": self.adapter_name})
            if response.status_code >= 400 and response.status_code != 404:
                raise self.failure("unload", response, version, path)
            self.loaded = False
        body: dict[str, Any] = {
            "lora_name": self.adapter_name,
            "lora_path": str(path),
            LOAD_VERSION_FIELD: version,
        }
        if inplace:
            body["load_inplace"] = True
        response = self._post(LOAD_ROUTE, body)
        if response.status_code >= 400:
            error = self.failure("load", response, version, path)
            raise LoraSyncError(
                f"{error} {self.restore(last)}", error.status, error.body, error.server_message
            )
        self.loaded = True
        return inplace

    def confirm(self, path: Path, version: int) -> None:
        """``GET /v1/models`` must list the adapter with ``root`` equal to ``path``."""
        root = self.served_root()
        self.loaded = root is not None
        if root is None or os.path.normpath(root) != os.path.normpath(path):
            seen = "does not list it" if root is None else f"reports root {root!r}"
            raise LoraSyncError(
                f"{self.label}the server accepted adapter {self.adapter_name!r} version "
                f"{version} ({path}), but GET {self.url}/v1/models {seen}; the version was not "
                "confirmed. Is another process loading adapters under the same name?"
            )

    def restore(self, last: Published | None) -> str:
        """After a failed or unconfirmed load, load ``last`` again; say what happened."""
        where = f" on {self.url}" if self.label else ""
        if last is None:
            return f"No earlier version of it was published by this LoraSync{where}."
        version, path = last
        try:
            root = self.served_root()
            if root is not None and os.path.normpath(root) == os.path.normpath(path):
                self.loaded = True
                return f"The server{where} still serves version {version}."
            body: dict[str, Any] = {
                "lora_name": self.adapter_name,
                "lora_path": path,
                LOAD_VERSION_FIELD: version,
            }
            if root is not None and self.capabilities is not None and self.capabilities.inplace:
                body["load_inplace"] = True  # vLLM records the failed path as root: undo it
            response = self._post(LOAD_ROUTE, body)
            if response.status_code >= 400:
                self.loaded = root is not None
                return (
                    f"Reloading version {version}{where} failed too (HTTP "
                    f"{response.status_code}: {server_message(response)}); requests for "
                    f"{self.adapter_name!r} may fail."
                )
        except NemoGymError as exc:  # reported inside the error being raised
            return f"Reloading version {version}{where} failed too ({type(exc).__name__}: {exc})."
        self.loaded = True
        return f"Version {version} was loaded again and is served{where}."

    def failure(
        self, action: str, response: requests.Response, version: int, path: Path
    ) -> LoraSyncError:
        """The error of a refused request, with the server's message and a hint."""
        message = server_message(response)
        hint = ""
        if response.status_code in (404, 405) and message in ("Not Found", "Method Not Allowed"):
            hint = f" The server has no such route. {ENABLE_RUNTIME_LORA}"
        elif "max_lora_rank" in message:
            hint = " Start vLLM with a --max-lora-rank at least the adapter's r."
        elif "No adapter found" in message or "does not exist" in message:
            hint = (
                f" The server must be able to read {path}: run it on the same host as the "
                "trainer, or put directory= on a filesystem both see at the same path."
            )
        return LoraSyncError(
            f"{self.label}{action} of LoRA adapter {self.adapter_name!r} version {version} "
            f"({path}) failed: HTTP {response.status_code}: {message}.{hint}",
            response.status_code,
            response.text[:_MAX_BODY],
            message,
        )


def root_of(cards: list[Any], name: str) -> str | None:
    """The ``root`` of card ``name`` ("" when it has none), or None when it is not listed."""
    for card in cards:
        if card.get("id") == name:
            root = card.get("root")
            return str(root) if root is not None else ""
    return None
