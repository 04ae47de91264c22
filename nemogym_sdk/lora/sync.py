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

**Several replicas** (``base_url`` a list: samplers that serve one policy, e.g. behind
``vllm-router``, which forwards a load to one worker only): steps 2 and 3 run on each, and
the publish is all or nothing: if a replica refuses the version (or does not confirm it),
every replica that had loaded it loads the last confirmed version again, and the error
names the replica that refused. (``nemogym_sdk.serve`` in front of a router does the same
fan-out itself, so a ``LoraSync`` pointed at it needs one URL.)

``LoraSync`` is called by one process: rank 0 calls ``initialize`` and ``sync``; other
ranks wait at a barrier, which is the trainer's job (``install_lora_sync`` does it).
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import attrs
import requests

from nemogym_sdk.errors import ConfigError, LoraSyncError, NemoGymError
from nemogym_sdk.hosts import server_root
from nemogym_sdk.lora import _adapter
from nemogym_sdk.lora.probe import (
    LoraCapabilities,
)
from nemogym_sdk.lora.replica import AdapterServer, Published
from nemogym_sdk.lora.versions import AdapterVersions

__all__ = ["LoraSync", "SyncRecord"]

logger = logging.getLogger(__name__)


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
        base_url: the inference server, ``http://host:port`` or ``http://host:port/v1``; or
            a list of them, replicas that serve one policy (each gets every version, all or
            nothing).
        adapter_name: the name to serve the adapter under. It must be the model name
            NeMo Gym's model server requests (see ``check_served_name``), or rollouts
            sample the base model.
        directory: where versions are written, as ``<directory>/<adapter_name>/v000001``.
            The server reads adapters from there: same host, or a filesystem shared at
            the same path. Checked for writing here.
        keep: how many of the newest versions to keep on disk (at least 1; more when the
            server says it keeps more loaded side by side, ``versions_kept``).
        timeout: seconds per request (loading a large adapter takes a while).
        session: a ``requests.Session`` to use (not closed by ``close``).
        api_key: bearer token, when the server was started with ``--api-key``.
    """

    def __init__(
        self,
        base_url: str | Sequence[str],
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
        urls = [base_url] if isinstance(base_url, str) else list(base_url)
        if not urls:
            raise ConfigError("LoraSync needs at least one server URL")
        self.base_urls: tuple[str, ...] = tuple(dict.fromkeys(server_root(u) for u in urls))
        """Every server root the adapter is published to (the replicas)."""
        self.base_url = self.base_urls[0]
        """The first server root, ``http://host:port``."""
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
        several = len(self.base_urls) > 1
        self._servers = [
            AdapterServer(
                url,
                adapter_name,
                http=self._http,
                timeout=timeout,
                headers=self._headers,
                label=f"replica {url}: " if several else "",
            )
            for url in self.base_urls
        ]
        self._history: list[SyncRecord] = []
        self._server_keeps: int | None = None  # versions the server keeps loaded, if it says
        self._lock = threading.Lock()

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
        """What the (first) server offers, once probed (the first publish probes)."""
        caps: LoraCapabilities | None = self._servers[0].capabilities
        return caps

    def version_path(self, version: int) -> Path:
        """The directory of ``version``: ``<directory>/<adapter_name>/v{version:06d}``."""
        return self._store.path(version)

    def __repr__(self) -> str:
        where = self.base_url if len(self.base_urls) == 1 else list(self.base_urls)
        return (
            f"LoraSync(base_url={where!r}, adapter_name={self.adapter_name!r}, "
            f"version={self.version!r}, directory={str(self.directory)!r})"
        )

    # --- public operations ----------------------------------------------------------------

    def probe(self) -> LoraCapabilities:
        """Read every server's LoRA capabilities now (``probe_lora_support``); loads nothing.
        Returns the first one's."""
        first, *others = self._servers
        caps = first.probe()
        for server in others:
            server.probe()
        return caps

    def initialize(
        self, model: object, *, require_zero: bool = True, version: int = 0, state_dict: Any = None
    ) -> SyncRecord:
        """Publish the first version of ``model``'s adapter (``version``, 0 by default);
        call it before the first rollout.

        From the first rollout on, NeMo Gym's model server requests ``adapter_name``: it
        must be loaded by then (the served-name rule). With ``require_zero`` every
        ``lora_B`` weight must be exactly zero (PEFT's default init), so version 0 equals
        the base model; pass ``require_zero=False`` to start from a trained adapter. A
        resumed run passes the version its checkpoint's weights had (``require_zero=False``,
        ``version=steps done``), so the sampler sees the same version sequence as a run
        that was never stopped. A sharded model passes its gathered ``state_dict``, as
        for `sync`.

        Raises:
            ConfigError: a ``lora_B`` weight is nonzero, ``version`` is negative, or a
                version was already published.
        """
        if self._history:
            raise self._initialized_twice()
        if version < 0:
            raise ConfigError(f"the first adapter version must be >= 0, got {version}")
        if require_zero:
            nonzero = _adapter.first_nonzero_lora_b(model, state_dict=state_dict)
            if nonzero is not None:
                name, largest = nonzero
                raise ConfigError(
                    f"initialize() requires a zero LoRA adapter (every lora_B weight exactly 0, "
                    f"so version 0 equals the base model), but {name} has max |w| = "
                    f"{largest:.3g}. Pass initialize(model, require_zero=False) to start from a "
                    "trained adapter. Inits such as PiSSA, OLoRA or LoftQ also change the base "
                    "weights, which the inference server does not have: use the default init."
                )
        return self._publish(
            lambda tmp: _adapter.save_adapter(model, tmp, state_dict=state_dict), initial=version
        )

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
        of this ``LoraSync``'s version directories. With several replicas, the version all
        of them serve; ``LoraSyncError`` naming each when they differ.
        """
        served = self.served_versions()
        found = set(served.values())
        if len(found) > 1:
            listing = ", ".join(f"{url}: {version}" for url, version in served.items())
            raise LoraSyncError(
                f"the replicas serve different versions of adapter "
                f"{self.adapter_name!r} ({listing})"
            )
        return found.pop()

    def served_versions(self) -> dict[str, int | None]:
        """The version each server serves now (``served_version`` per replica)."""
        out: dict[str, int | None] = {}
        for server in self._servers:
            root = server.served_root()
            out[server.url] = None if root is None else self._store.version_of(root)
        return out

    def versions_kept(self) -> int | None:
        """How many versions of the adapter the server keeps loaded side by side
        (``nemogym_sdk.serve --adapter-versions``), read from its ``/v1/models`` card; None
        when the server does not say (vLLM alone) or does not list the adapter. With several
        replicas, the fewest any of them keeps."""
        kept = [server.versions_kept() for server in self._servers]
        return None if None in kept else min(k for k in kept if k is not None)

    def decode_capacity(self) -> int | None:
        """How many generations the sampler decodes at once, from its ``/v1/models`` card
        (``nemogym_sdk.serve``'s ``max_num_seqs``; in front of replicas, their sum); None
        when it does not say (vLLM alone). With several servers published to, their sum."""
        capacities = [server.decode_capacity() for server in self._servers]
        return None if None in capacities else sum(c for c in capacities if c is not None)

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

    def _publish(self, write: Callable[[Path], str], *, initial: int | None = None) -> SyncRecord:
        """Publish the next version (``initial``: the first one, that number)."""
        with self._lock:  # one publish at a time, so versions stay in order
            if initial is not None and self._history:
                raise self._initialized_twice()
            version = initial if initial is not None else self._next_version()
            began = time.perf_counter()
            for server in self._servers:
                _require_lora(server.capabilities or server.probe())
            writing = time.perf_counter()
            final = self._store.write(version, write)
            saved = time.perf_counter()
            inplace, load_s = self._load_everywhere(final, version)
            loaded = time.perf_counter()
            if not self._history:
                self._server_keeps = self._read_versions_kept()
            self._prune(keep_also=final)
            record = SyncRecord(
                version=version,
                adapter_name=self.adapter_name,
                path=str(final),
                inplace=inplace,
                save_s=saved - writing,
                load_s=load_s,
                confirm_s=loaded - saved - load_s,
                total_s=time.perf_counter() - began,
            )
            self._history.append(record)
            logger.info(
                "LoRA adapter %r version %d served from %s by %d server(s) (%s, %.3f s)",
                self.adapter_name,
                version,
                final,
                len(self._servers),
                "in place" if inplace else "loaded",
                record.total_s,
            )
            return record

    def _load_everywhere(self, path: Path, version: int) -> tuple[bool, float]:
        """Load and confirm ``version`` on every server, or none: (whether every load was
        in place, seconds in the loads). A refusal on one restores the last version on
        those that had it loaded, and the error says so."""
        last = (self._history[-1].version, self._history[-1].path) if self._history else None
        several = len(self._servers) > 1
        done: list[AdapterServer] = []
        inplace, load_s = True, 0.0
        for server in self._servers:
            began = time.perf_counter()
            try:
                inplace = server.load(path, version, last) and inplace  # a refusal restores it
            except NemoGymError as error:
                raise _undone(error, server, done, last) from None
            load_s += time.perf_counter() - began
            try:
                server.confirm(path, version)
            except NemoGymError as error:
                raise _undone(error, server, [*done, server] if several else done, last) from None
            done.append(server)
        return inplace, load_s

    def _read_versions_kept(self) -> int | None:
        try:
            return self.versions_kept()
        except NemoGymError:  # the files are kept as configured; nothing else depends on it
            return None

    def _prune(self, *, keep_also: Path) -> None:
        """Delete version directories except the newest ``keep`` confirmed ones, or as many
        as the server keeps loaded, if more: a replica that comes back (``nemogym_sdk.serve``
        in front of replicas) loads every version still served, from these files."""
        keep = max(self.keep, self._server_keeps or 0)
        recent = self._history[-(keep - 1) :] if keep > 1 else []
        self._store.prune({keep_also, *(Path(r.path) for r in recent)})


# --- helpers ------------------------------------------------------------------------------


def _undone(
    error: NemoGymError,
    server: AdapterServer,
    servers: list[AdapterServer],
    last: Published | None,
) -> NemoGymError:
    """``error`` after loading ``last`` again on ``servers`` (the replicas that had loaded
    the refused version), saying what that did; named by the replica when there are
    several."""
    if not servers and not server.label:
        return error
    note = " ".join(s.restore(last) for s in servers)
    if isinstance(error, LoraSyncError):
        return LoraSyncError(
            f"{error} {note}".rstrip(), error.status, error.body, error.server_message
        )
    message = f"{error} {note}".rstrip()
    if server.label and not str(error).startswith(server.label):
        message = f"{server.label}{message}"
    try:
        return type(error)(message)
    except TypeError:  # an error class with other arguments: keep it, with the note
        return LoraSyncError(f"{type(error).__name__}: {message}")


def _require_lora(caps: LoraCapabilities) -> None:
    if caps.routes_known and not caps.supports_lora:
        raise ConfigError(f"cannot sync LoRA adapters to {caps.base_url}: {caps.why_not()}")
