"""``LoraSync``: publish each new LoRA adapter to the inference server, by name, versioned.

One publish, start to end (``sync``, ``initialize`` and ``push`` all do this):

1. write the adapter to ``<directory>/<adapter_name>/v{version:06d}``: into a temporary
   sibling first, renamed into place, so a server never reads a half-written adapter;
2. ``POST /v1/load_lora_adapter {lora_name, lora_path, load_inplace: true,
   policy_version}`` when the server supports in-place loads (a plain load while the name
   is not loaded yet); otherwise ``POST /v1/unload_lora_adapter`` then a plain load.
   ``policy_version`` is the version number: ``nemogym_sdk.serve`` tags every answer with the
   version that generated it (and may keep several side by side, ``--adapter-versions``);
   vLLM ignores the key;
3. confirm: ``GET /v1/models`` must list ``adapter_name`` with ``root`` equal to the new
   path;
4. delete version directories beyond the newest ``keep``.

Only then does ``version`` advance. Every failure raises (``LoraSyncError`` with the
server's own message, ``TransportError``, ``DeadlineError``); none is a warning. After a
failed load the last confirmed version is loaded again when possible, so that the server
and ``version`` agree; the error says whether that worked.

``LoraSync`` is called by one process: rank 0 calls ``initialize`` and ``sync``; other
ranks wait at a barrier, which is the trainer's job (``install_lora_sync`` does it).
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import attrs
import requests

from nemogym_sdk._http import server_message
from nemogym_sdk.errors import ConfigError, LoraSyncError, NemoGymError
from nemogym_sdk.hosts import server_root
from nemogym_sdk.lora import _adapter
from nemogym_sdk.lora.probe import (
    ENABLE_RUNTIME_LORA,
    LOAD_ROUTE,
    UNLOAD_ROUTE,
    LoraCapabilities,
    probe_lora_support,
    read_models,
    request,
)
from nemogym_sdk.lora.versions import AdapterVersions
from nemogym_sdk.wire import CARD_VERSIONS_KEPT_FIELD, LOAD_VERSION_FIELD

__all__ = ["LoraSync", "SyncRecord"]

logger = logging.getLogger(__name__)

_VERSION_DIR = re.compile(r"v(\d{6,})")
_MAX_BODY = 2000


@attrs.frozen(kw_only=True)
class SyncRecord:
    """One confirmed publish of an adapter version."""

    version: int
    """Version number: 0 is the initial adapter, each later publish adds one."""
    adapter_name: str
    """The name the server serves the adapter under."""
    path: str
    """Absolute directory the server loaded (``lora_path``, and the card's ``root``)."""
    inplace: bool
    """Swapped with ``load_inplace`` (the name never went missing); False for the first
    load and for unload-then-load."""
    save_s: float
    """Seconds spent writing the adapter (saving, or copying for ``push``)."""
    load_s: float
    """Seconds spent in the load (and unload) requests."""
    confirm_s: float
    """Seconds spent confirming through ``GET /v1/models``."""
    total_s: float
    """Seconds for the whole publish, pruning included."""


class LoraSync:
    """Publish a trainer's LoRA adapter to a vLLM-compatible server after each step.

    Args:
        base_url: the inference server, ``http://host:port`` or ``http://host:port/v1``.
        adapter_name: the name to serve the adapter under. It must be the model name
            NeMo Gym's model server requests (see ``check_served_name``), or rollouts
            sample the base model.
        directory: where versions are written, as ``<directory>/<adapter_name>/v000001``.
            The server reads adapters from there: same host, or a filesystem shared at
            the same path. Checked for writing here.
        keep: how many of the newest versions to keep on disk (at least 1).
        timeout: seconds per request (loading a large adapter takes a while).
        session: a ``requests.Session`` to use (not closed by ``close``).
        api_key: bearer token, when the server was started with ``--api-key``.
    """

    def __init__(
        self,
        base_url: str,
        adapter_name: str,
        directory: str | os.PathLike[str],
        *,
        keep: int = 2,
        timeout: float = 60.0,
        session: requests.Session | None = None,
        api_key: str | None = None,
    ) -> None:
        if not adapter_name or adapter_name != adapter_name.strip() or adapter_name in (".", ".."):
            raise ConfigError(f"invalid adapter name {adapter_name!r}")
        if "/" in adapter_name or os.sep in adapter_name:
            raise ConfigError(f"adapter name {adapter_name!r} must not contain a path separator")
        if keep < 1:
            raise ConfigError(f"keep must be >= 1 (the served version stays on disk), got {keep}")
        if timeout <= 0:
            raise ConfigError(f"timeout must be > 0, got {timeout}")
        self.base_url = server_root(base_url)
        """Server root, ``http://host:port``."""
        self.adapter_name = adapter_name
        """The name the adapter is served under."""
        self.directory = Path(directory).expanduser().resolve()
        """Root directory for adapter versions."""
        self.keep = keep
        """How many versions stay on disk."""
        self.timeout = timeout
        """Seconds per request."""
        self._store = AdapterVersions(self.directory / adapter_name)
        self._http = session or requests.Session()
        self._owns_session = session is None
        self._api_key = api_key
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._capabilities: LoraCapabilities | None = None
        self._loaded: bool | None = None  # is adapter_name loaded on the server?
        self._history: list[SyncRecord] = []
        self._lock = threading.Lock()
        self._told_unknown_routes = False

    # --- state ----------------------------------------------------------------------------

    @property
    def version(self) -> int | None:
        """The last confirmed version; ``None`` before the first publish."""
        return self._history[-1].version if self._history else None

    @property
    def history(self) -> tuple[SyncRecord, ...]:
        """Every confirmed publish, oldest first."""
        return tuple(self._history)

    @property
    def versions_dir(self) -> Path:
        """``<directory>/<adapter_name>``, where the version directories live."""
        return self._store.root

    @property
    def capabilities(self) -> LoraCapabilities | None:
        """What the server offers, once probed (the first publish probes)."""
        return self._capabilities

    def version_path(self, version: int) -> Path:
        """The directory of ``version``: ``<directory>/<adapter_name>/v{version:06d}``."""
        return self._store.path(version)

    def __repr__(self) -> str:
        return (
            f"LoraSync(base_url={self.base_url!r}, adapter_name={self.adapter_name!r}, "
            f"version={self.version!r}, directory={str(self.directory)!r})"
        )

    # --- public operations ----------------------------------------------------------------

    def probe(self) -> LoraCapabilities:
        """Read the server's LoRA capabilities now (``probe_lora_support``); loads nothing."""
        caps = probe_lora_support(
            self.base_url,
            timeout=self.timeout,
            api_key=self._api_key,
            session=self._http,
        )
        assert caps is not None  # a URL always gives capabilities
        self._capabilities = caps
        self._loaded = self.adapter_name in caps.adapters
        return caps

    def initialize(self, model: object, *, require_zero: bool = True) -> SyncRecord:
        """Publish version 0 of ``model``'s adapter; call it before the first rollout.

        From the first rollout on, NeMo Gym's model server requests ``adapter_name``: it
        must be loaded by then (the served-name rule). With ``require_zero`` every
        ``lora_B`` weight must be exactly zero (PEFT's default init), so version 0 equals
        the base model; pass ``require_zero=False`` to start from a trained adapter.

        Raises:
            ConfigError: a ``lora_B`` weight is nonzero, or a version was already published.
        """
        if self._history:
            raise self._initialized_twice()
        if require_zero:
            nonzero = _adapter.first_nonzero_lora_b(model)
            if nonzero is not None:
                name, largest = nonzero
                raise ConfigError(
                    f"initialize() requires a zero LoRA adapter (every lora_B weight exactly 0, "
                    f"so version 0 equals the base model), but {name} has max |w| = "
                    f"{largest:.3g}. Pass initialize(model, require_zero=False) to start from a "
                    "trained adapter. Inits such as PiSSA, OLoRA or LoftQ also change the base "
                    "weights, which the inference server does not have: use the default init."
                )
        return self._publish(lambda tmp: _adapter.save_adapter(model, tmp), initial=True)

    def sync(self, model: object, *, state_dict: Any = None) -> SyncRecord:
        """Save ``model``'s active LoRA adapter as the next version and publish it.

        ``model`` is a ``peft.PeftModel`` (DDP-style ``.module`` wrappers are unwrapped).
        For sharded models (FSDP, ZeRO-3) gather the full state dict on every rank and
        pass it as ``state_dict`` here, on rank 0. Needs torch and peft.
        """
        return self._publish(lambda tmp: _adapter.save_adapter(model, tmp, state_dict=state_dict))

    def push(self, path: str | os.PathLike[str]) -> SyncRecord:
        """Publish an adapter directory saved elsewhere (copied in as the next version)."""
        source = Path(path).expanduser().resolve()
        if not (source / "adapter_config.json").is_file():
            raise ConfigError(
                f"{source} is not a PEFT adapter directory (no adapter_config.json); save one "
                "with model.save_pretrained(path)"
            )

        def copy(tmp: Path) -> str:
            target = tmp / "adapter"
            shutil.copytree(source, target)
            return str(target)

        return self._publish(copy)

    def served_version(self) -> int | None:
        """The version the server serves now, read back from ``/v1/models``.

        ``None`` when the adapter is not loaded, or was loaded from a path that is not one
        of this ``LoraSync``'s version directories.
        """
        cards = read_models(self._http, self.base_url, timeout=self.timeout, headers=self._headers)
        root = _root_of(cards, self.adapter_name)
        if root is None:
            return None
        return self._store.version_of(root)

    def versions_kept(self) -> int | None:
        """How many versions of the adapter the server keeps loaded side by side
        (``nemogym_sdk.serve --adapter-versions``), read from its ``/v1/models`` card; None
        when the server does not say (vLLM alone) or does not list the adapter."""
        cards = read_models(self._http, self.base_url, timeout=self.timeout, headers=self._headers)
        card = next((c for c in cards if c.get("id") == self.adapter_name), None)
        kept = None if card is None else card.get(CARD_VERSIONS_KEPT_FIELD)
        return kept if isinstance(kept, int) and not isinstance(kept, bool) else None

    def require_versions_kept(self, count: int) -> None:
        """Raise ``ConfigError`` unless the server keeps ``count`` versions of the adapter
        side by side and reports the version of every answer (what asynchronous training
        with ``max_staleness = count - 2`` needs: ``nemogym_sdk.serve --adapter-versions``,
        alone or in front of vLLM)."""
        kept = self.versions_kept()
        if kept is None:
            raise ConfigError(
                f"asynchronous training needs a sampler that reports the adapter version of "
                f"every turn and keeps versions side by side; {self.base_url} does not (vLLM "
                "alone does not): put nemogym_sdk.serve in front of it (--backend vllm)"
            )
        if kept < count:
            raise ConfigError(
                f"the sampler at {self.base_url} keeps {kept} version(s) of adapter "
                f"{self.adapter_name!r}; a staleness bound of {count - 2} needs {count}: start "
                f"it with --adapter-versions {count}"
            )

    def close(self) -> None:
        """Close the HTTP session, if this object created it."""
        if self._owns_session:
            self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # --- the publish ----------------------------------------------------------------------

    def _initialized_twice(self) -> ConfigError:
        return ConfigError(
            f"{self!r} already published version {self.version}; initialize() publishes "
            "version 0 once, before the first rollout (use sync() afterwards)"
        )

    def _next_version(self) -> int:
        if self.version is None:
            logger.info(
                "first publish of adapter %r is a sync(), not initialize(): rollouts before it "
                "could not sample the adapter",
                self.adapter_name,
            )
            return 1
        return self.version + 1

    def _publish(self, write: Callable[[Path], str], *, initial: bool = False) -> SyncRecord:
        with self._lock:  # one publish at a time, so versions stay in order
            if initial and self._history:
                raise self._initialized_twice()
            version = 0 if initial else self._next_version()
            began = time.perf_counter()
            caps = self._capabilities or self.probe()
            _require_lora(caps)
            writing = time.perf_counter()
            final = self._store.write(version, write)
            saved = time.perf_counter()
            inplace = self._load(final, version)
            loaded = time.perf_counter()
            self._confirm(final, version)
            confirmed = time.perf_counter()
            self._prune(keep_also=final)
            record = SyncRecord(
                version=version,
                adapter_name=self.adapter_name,
                path=str(final),
                inplace=inplace,
                save_s=saved - writing,
                load_s=loaded - saved,
                confirm_s=confirmed - loaded,
                total_s=time.perf_counter() - began,
            )
            self._history.append(record)
            logger.info(
                "LoRA adapter %r version %d served from %s (%s, %.3f s)",
                self.adapter_name,
                version,
                final,
                "in place" if inplace else "loaded",
                record.total_s,
            )
            return record

    def _post(self, route: str, body: dict[str, Any]) -> requests.Response:
        return request(
            self._http,
            "POST",
            f"{self.base_url}{route}",
            timeout=self.timeout,
            headers=self._headers,
            body=body,
        )

    def _load(self, path: Path, version: int) -> bool:
        """Load ``path`` under the adapter name; return whether it was swapped in place."""
        caps = self._capabilities
        assert caps is not None
        loaded = bool(self._loaded)
        inplace = caps.inplace and loaded
        if loaded and not caps.inplace:
            if not caps.routes_known and not self._told_unknown_routes:
                self._told_unknown_routes = True
                logger.warning(
                    "%s/openapi.json unreadable (%s): replacing adapter %r by unload then load; "
                    "requests for it fail with 404 until the load completes",
                    self.base_url,
                    caps.routes_error,
                    self.adapter_name,
                )
            response = self._post(UNLOAD_ROUTE, {"lora_name": self.adapter_name})
            if response.status_code >= 400 and response.status_code != 404:
                raise self._failure("unload", response, version, path)
            self._loaded = False
        body: dict[str, Any] = {
            "lora_name": self.adapter_name,
            "lora_path": str(path),
            LOAD_VERSION_FIELD: version,
        }
        if inplace:
            body["load_inplace"] = True
        response = self._post(LOAD_ROUTE, body)
        if response.status_code >= 400:
            error = self._failure("load", response, version, path)
            raise LoraSyncError(
                f"{error} {self._restore_last()}",
                error.status,
                error.body,
                error.server_message,
            )
        self._loaded = True
        return inplace

    def _confirm(self, path: Path, version: int) -> None:
        cards = read_models(self._http, self.base_url, timeout=self.timeout, headers=self._headers)
        root = _root_of(cards, self.adapter_name)
        self._loaded = root is not None
        if root is None or os.path.normpath(root) != os.path.normpath(path):
            seen = "does not list it" if root is None else f"reports root {root!r}"
            raise LoraSyncError(
                f"the server accepted adapter {self.adapter_name!r} version {version} "
                f"({path}), but GET {self.base_url}/v1/models {seen}; the version was not "
                "confirmed. Is another process loading adapters under the same name?"
            )

    def _restore_last(self) -> str:
        """After a failed load, load the last confirmed version again; say what happened."""
        if not self._history:
            return "No earlier version of it was published by this LoraSync."
        last = self._history[-1]
        try:
            cards = read_models(
                self._http, self.base_url, timeout=self.timeout, headers=self._headers
            )
            root = _root_of(cards, self.adapter_name)
            if root is not None and os.path.normpath(root) == os.path.normpath(last.path):
                self._loaded = True
                return f"The server still serves version {last.version}."
            body: dict[str, Any] = {
                "lora_name": self.adapter_name,
                "lora_path": last.path,
                LOAD_VERSION_FIELD: last.version,
            }
            if root is not None and self._capabilities is not None and self._capabilities.inplace:
                body["load_inplace"] = True  # vLLM records the failed path as root: undo it
            response = self._post(LOAD_ROUTE, body)
            if response.status_code >= 400:
                self._loaded = root is not None
                return (
                    f"Reloading version {last.version} failed too (HTTP {response.status_code}: "
                    f"{server_message(response)}); requests for {self.adapter_name!r} may fail."
                )
        except NemoGymError as exc:  # reported inside the error being raised
            return f"Reloading version {last.version} failed too ({type(exc).__name__}: {exc})."
        self._loaded = True
        return f"Version {last.version} was loaded again and is served."

    def _failure(
        self, action: str, response: requests.Response, version: int, path: Path
    ) -> LoraSyncError:
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
            f"{action} of LoRA adapter {self.adapter_name!r} version {version} ({path}) failed: "
            f"HTTP {response.status_code}: {message}.{hint}",
            response.status_code,
            response.text[:_MAX_BODY],
            message,
        )

    def _prune(self, *, keep_also: Path) -> None:
        """Delete version directories except the newest ``keep`` confirmed ones."""
        recent = self._history[-(self.keep - 1) :] if self.keep > 1 else []
        self._store.prune({keep_also, *(Path(r.path) for r in recent)})


# --- helpers ------------------------------------------------------------------------------


def _require_lora(caps: LoraCapabilities) -> None:
    if caps.routes_known and not caps.supports_lora:
        raise ConfigError(f"cannot sync LoRA adapters to {caps.base_url}: {caps.why_not()}")


def _root_of(cards: list[Any], name: str) -> str | None:
    for card in cards:
        if card.get("id") == name:
            root = card.get("root")
            return str(root) if root is not None else ""
    return None
