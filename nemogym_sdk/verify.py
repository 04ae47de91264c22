"""Scoring completions on NeMo Gym resources servers: ``/seed_session`` then ``/verify``.

``Verifier`` is the one ``/verify`` scorer of the SDK; every reward function that scores
through ``/verify`` (``reward_nemo_gym_verify`` here, the TRL adapter's
``TRLVerifyReward``, the axolotl adapter's ``AxolotlVerifyReward``) calls
``Verifier.score``, which returns a typed ``VerifyResult`` per completion. What a failed
verification becomes is each caller's choice, stated in its docs: 0.0 here (the seed's
contract, counted and logged), ``None`` in TRL (unscorable), the group's completed mean
in axolotl's deferred scoring.

Which resources server scores a row (``resources_server_for``), in this one order:

1. the row's own ``resources_server_ref.name``;
2. the caller's default (``resources_server=``), for rows that name none;
3. the resources server the row's agent is configured with (``agent_ref.name``, else
   the deployment's only agent);
4. the only resources server deployed.

A row none of these resolves, or that names a server the deployment lacks, is a
``DiscoveryError`` from ``resources_server_for`` and an ``INVALID`` result from
``score``.

Per completion, concurrently, ``Verifier`` sends ``POST /seed_session`` with the row
(environments that keep state key it by the session cookie this sets), then ``POST
/verify`` with the row, its ``responses_create_params`` untouched (tools, system prompt,
metadata), and a well-formed Responses-API ``response`` built from the completion,
carrying the session cookie. Each completion has its own cookie jar. It sends through
the same retry/deadline/status path as ``AgentClient``.
"""

from __future__ import annotations

import asyncio
import atexit
import collections
import json
import logging
import os
import threading
from collections.abc import Hashable, Mapping, Sequence
from typing import Any

import attrs

from nemogym_sdk._net.session import STATUS_OF, SessionOwner
from nemogym_sdk.directory import DEFAULT_HEAD, ServerDirectory
from nemogym_sdk.errors import ConfigError, DiscoveryError, NemoGymError
from nemogym_sdk.hosts import base_url
from nemogym_sdk.policy import RetryPolicy, Timeouts
from nemogym_sdk.records import RolloutStatus
from nemogym_sdk.wire import (
    RESOURCES,
    RESOURCES_SERVER_REF,
    SEED_SESSION_ROUTE,
    VERIFY_ROUTE,
    agent_name,
    build_response,
    build_verify_body,
    decode_verify_result,
    resources_server_name,
    row_tools,
)

__all__ = [
    "Verifier",
    "resources_server_for",
    "VerifyItem",
    "VerifyResult",
    "VerifyStats",
    "clear_verifier_cache",
    "reward_nemo_gym_verify",
    "verify_stats",
]

logger = logging.getLogger(__name__)

HEAD_ENV_VAR = "NEMOGYM_HEAD_URL"
"""Where ``reward_nemo_gym_verify`` looks for the head server when not told."""


@attrs.frozen(kw_only=True)
class VerifyItem:
    """One completion to score."""

    resources_server: str
    """Instance name of the resources server that scores it."""
    row: Mapping[str, Any] = attrs.field(eq=False)
    """The dataset row (``responses_create_params`` and task fields)."""
    completion: str | Sequence[Mapping[str, Any]] = attrs.field(eq=False)
    """Text, chat messages, or Responses output items."""


@attrs.frozen(kw_only=True)
class VerifyResult:
    """The verdict on one completion."""

    status: RolloutStatus
    """``OK`` when the server returned a reward."""
    reward: float | None = None
    """The reward; None when verification failed."""
    reward_components: Mapping[str, float] = attrs.field(factory=dict)
    """Named reward terms, when the server returns them."""
    mask_sample: bool = False
    """The environment asked to leave this sample out."""
    error: str | None = None
    """Why verification failed."""
    response: Mapping[str, Any] | None = attrs.field(default=None, eq=False, repr=False)
    """The server's whole ``/verify`` answer."""


def _verdict(body: bytes) -> VerifyResult:
    answer = decode_verify_result(body)
    if answer.invalid is not None:
        return VerifyResult(status=RolloutStatus.INVALID, error=answer.invalid)
    return VerifyResult(
        status=RolloutStatus.MASKED if answer.mask_sample else RolloutStatus.OK,
        reward=answer.reward,
        reward_components=answer.reward_components,
        mask_sample=answer.mask_sample,
        response=answer.data,
    )


def resources_server_for(
    row: Mapping[str, Any], directory: ServerDirectory, *, default: str | None = None
) -> str:
    """The resources server instance that scores ``row`` (the order in the module docstring).

    Raises:
        DiscoveryError: no rule names a server, or the one named is not deployed.
    """
    deployed = directory.resources_servers
    name = resources_server_name(row) or default
    how = "the row's resources_server_ref" if resources_server_name(row) else "the default"
    if name is None:
        agent = agent_name(row) or directory.default_agent
        name = directory.resources_server_of(agent) if agent is not None else None
        how = f"agent {agent!r}'s config"
    if name is None and len(deployed) == 1:
        name, how = next(iter(deployed)), "the only resources server"
    if name is None:
        raise DiscoveryError(
            f"cannot tell which resources server scores the row (no {RESOURCES_SERVER_REF}, no "
            f"default, no agent whose config names one); deployed: "
            f"{', '.join(deployed) or '(none)'}. Name it in the row's {RESOURCES_SERVER_REF} "
            "or pass a default resources server"
        )
    if name not in deployed:
        raise DiscoveryError(
            f"no resources server named {name!r} (from {how}); deployed: "
            f"{', '.join(deployed) or '(none)'}"
        )
    return name


class Verifier(SessionOwner):
    """Concurrent, retried ``/seed_session`` + ``/verify`` calls.

    Args:
        servers: resources server instance name -> URL, or a ``ServerDirectory``.
        model_name: ``model`` written into the built Responses object.
        seed_session: call ``/seed_session`` first (needed by stateful environments).
        timeouts: deadlines; ``/verify`` is short, so the default request timeout is 60 s.
        retry: retry policy for connection errors, 429 and 5xx.
        max_concurrency: verifications in flight at once.
        max_per_host: verifications in flight per server.
    """

    _thread_name = "nemogym-sdk-verify"

    def __init__(
        self,
        servers: Mapping[str, str] | ServerDirectory,
        *,
        model_name: str = "policy",
        seed_session: bool = True,
        timeouts: Timeouts = Timeouts(connect=5.0, request=60.0),
        retry: RetryPolicy = RetryPolicy(),
        max_concurrency: int = 64,
        max_per_host: int = 64,
        seed: int | None = None,
    ) -> None:
        super().__init__(
            timeouts=timeouts,
            retry=retry,
            max_concurrency=max_concurrency,
            max_per_host=max_per_host,
            seed=seed,
        )
        self.directory = ServerDirectory.of(servers, RESOURCES)
        self.model_name = model_name
        self.seed_session = seed_session

    async def _one(self, item: VerifyItem, deadline: float | None) -> VerifyResult:
        try:
            base = self.directory.resources_url(item.resources_server)
        except DiscoveryError as exc:
            return VerifyResult(status=RolloutStatus.INVALID, error=str(exc))
        try:
            response = build_response(
                item.completion, model=self.model_name, tools=row_tools(item.row)
            )
            seed_body = json.dumps(dict(item.row)).encode()
            verify_body = json.dumps(build_verify_body(item.row, response)).encode()
        except (TypeError, ValueError, AttributeError) as exc:
            return VerifyResult(status=RolloutStatus.INVALID, error=f"cannot encode: {exc}")
        async with self._slot(base):
            cookies: dict[str, str] = {}
            if self.seed_session:
                seeded = await self._send(
                    f"{base}{SEED_SESSION_ROUTE}",
                    seed_body,
                    deadline,
                    cookies=cookies,
                    want_cookies=True,
                )
                if not seeded.ok:
                    return VerifyResult(status=STATUS_OF[seeded.outcome], error=seeded.error)
                cookies.update(seeded.cookies)
            answer = await self._send(
                f"{base}{VERIFY_ROUTE}", verify_body, deadline, cookies=cookies
            )
        if not answer.ok:
            return VerifyResult(status=STATUS_OF[answer.outcome], error=answer.error)
        return _verdict(answer.body)

    async def verify(self, items: Sequence[VerifyItem]) -> list[VerifyResult]:
        """Score every item concurrently; results in input order, failures as results."""
        self._bind()
        deadline = self._deadline()
        return list(await asyncio.gather(*(self._one(item, deadline) for item in items)))

    def verify_sync(self, items: Sequence[VerifyItem]) -> list[VerifyResult]:
        """``verify`` for synchronous callers, on the verifier's own loop thread."""
        return self._run_sync(self.verify(list(items)))

    def score(
        self,
        rows: Sequence[Mapping[str, Any]],
        completions: Sequence[str | Sequence[Mapping[str, Any]]],
        *,
        resources_server: str | None = None,
    ) -> list[VerifyResult]:
        """Score ``completions[i]`` on the resources server of ``rows[i]``; synchronous.

        The server of each row is chosen by ``resources_server_for`` (``resources_server``
        is the default for rows that name none); a row it cannot resolve gets an
        ``INVALID`` result saying why, and every other failure is a typed result too.
        Results are in input order.
        """
        if len(rows) != len(completions):
            raise ConfigError(f"{len(rows)} rows for {len(completions)} completions")
        results: list[VerifyResult | None] = [None] * len(rows)
        items, positions = [], []
        for position, (row, completion) in enumerate(zip(rows, completions, strict=True)):
            try:
                server = resources_server_for(row, self.directory, default=resources_server)
            except DiscoveryError as exc:
                results[position] = VerifyResult(status=RolloutStatus.INVALID, error=str(exc))
                continue
            items.append(VerifyItem(resources_server=server, row=row, completion=completion))
            positions.append(position)
        for position, result in zip(positions, self.verify_sync(items), strict=True):
            results[position] = result
        return [result for result in results if result is not None]


@attrs.define
class VerifyStats:
    """What ``reward_nemo_gym_verify`` scored in this process (read ``verify_stats``).

    ``unscored`` counts completions it returned 0.0 for because it could not score them
    (unknown server, unreachable head, failed or malformed ``/verify``), as opposed to a
    real reward of 0.0.
    """

    scored: int = 0
    """Completions that got a reward from their resources server."""
    unscored: int = 0
    """Completions scored 0.0 because they could not be scored."""
    unscored_by_status: dict[str, int] = attrs.field(factory=dict)
    """``unscored`` split by ``RolloutStatus`` value."""
    last_error: str | None = None
    """Why the most recent unscored completion could not be scored."""
    _lock: threading.Lock = attrs.field(factory=threading.Lock, repr=False, eq=False)

    def record(self, results: Sequence[VerifyResult]) -> list[VerifyResult]:
        """Count ``results``; return the ones that could not be scored."""
        failed = [r for r in results if r.reward is None]
        with self._lock:
            self.scored += len(results) - len(failed)
            self.unscored += len(failed)
            for result in failed:
                key = result.status.value
                self.unscored_by_status[key] = self.unscored_by_status.get(key, 0) + 1
                self.last_error = result.error
        return failed

    def reset(self) -> None:
        """Start counting from zero."""
        with self._lock:
            self.scored = self.unscored = 0
            self.unscored_by_status = {}
            self.last_error = None


verify_stats = VerifyStats()
"""The counters of ``reward_nemo_gym_verify`` (process-wide)."""

_CACHE_SIZE = 8
_cache: collections.OrderedDict[Hashable, Verifier] = collections.OrderedDict()
_cache_lock = threading.Lock()


def clear_verifier_cache() -> None:
    """Close and forget the verifiers ``reward_nemo_gym_verify`` keeps per deployment."""
    atexit.unregister(clear_verifier_cache)
    with _cache_lock:
        verifiers = list(_cache.values())
        _cache.clear()
    for verifier in verifiers:
        verifier.close()


def _deployment_key(kwargs: Mapping[str, Any]) -> tuple[Hashable, ...]:
    """What identifies the deployment a call scores on (and the model name it writes)."""
    model = str(kwargs.get("model_name", "policy"))
    if kwargs.get("directory") is not None:
        return ("directory", id(kwargs["directory"]), model)
    if kwargs.get("servers") is not None:
        servers = kwargs["servers"]
        if not isinstance(servers, Mapping):
            raise TypeError("servers must map resources server names to URLs")
        return ("servers", tuple(sorted((str(k), str(v)) for k, v in servers.items())), model)
    head = kwargs.get("head") or os.environ.get(HEAD_ENV_VAR) or DEFAULT_HEAD
    return ("head", base_url(str(head), default_port=11000), model)


def _servers_for(kwargs: Mapping[str, Any]) -> Mapping[str, str] | ServerDirectory:
    if kwargs.get("directory") is not None:
        directory = kwargs["directory"]
        if not isinstance(directory, ServerDirectory):
            raise TypeError("directory must be a ServerDirectory")
        return directory
    if kwargs.get("servers") is not None:
        servers = kwargs["servers"]
        assert isinstance(servers, Mapping)
        return servers
    head = kwargs.get("head") or os.environ.get(HEAD_ENV_VAR) or DEFAULT_HEAD
    return ServerDirectory.from_head(str(head))


def _verifier_for(kwargs: Mapping[str, Any]) -> tuple[tuple[Hashable, ...], Verifier]:
    """The cached verifier of the call's deployment, discovering it on first use."""
    key = _deployment_key(kwargs)
    with _cache_lock:
        verifier = _cache.get(key)
        if verifier is not None:
            _cache.move_to_end(key)
            return key, verifier
    verifier = Verifier(_servers_for(kwargs), model_name=str(key[-1]))
    with _cache_lock:
        raced = _cache.get(key)  # another thread built one meanwhile: use that one
        if raced is None:
            if not _cache:
                atexit.register(clear_verifier_cache)  # close sessions before exit
            _cache[key] = verifier
        evicted = _cache.popitem(last=False)[1] if len(_cache) > _CACHE_SIZE else None
    for extra in (evicted, verifier if raced is not None else None):
        if extra is not None:
            extra.close()
    return key, raced or verifier


def _forget(key: tuple[Hashable, ...], verifier: Verifier) -> None:
    with _cache_lock:
        if _cache.get(key) is verifier:
            del _cache[key]
    verifier.close()


def reward_nemo_gym_verify(
    completions: Sequence[Any], prompts: Sequence[Any] | None = None, **kwargs: Any
) -> list[float]:
    """Score each completion on its row's resources server (``/seed_session`` + ``/verify``).

    Keyword arguments (TRL passes dataset columns as per-row lists):
        resources_server_ref: per completion, ``{"name": <resources server instance>}``;
            a completion without one is scored by the server ``Verifier.score`` chooses
            (the module docstring's order).
        verify_extra: per completion, the dataset row (``responses_create_params`` + task
            fields); ``{}`` when absent.
        servers: resources server name -> URL; or ``directory``: a ``ServerDirectory``; or
            ``head``: the head server (else ``$NEMOGYM_HEAD_URL``, else 127.0.0.1:11000).
        model_name: ``model`` of the built Responses object.

    One ``Verifier`` (and one discovery) is kept per deployment and reused by later
    calls; a head-discovered one is dropped and rediscovered after a transport error
    (the deployment may have moved). ``clear_verifier_cache`` closes them.

    Returns one float per completion. As in the seed, an unknown server, a failed call or
    an unreachable head gives 0.0; each such completion is counted in ``verify_stats``
    and logged as a warning (use ``Verifier`` to tell failures from zeros).
    """
    refs = kwargs.get("resources_server_ref") or [{}] * len(completions)
    extras = kwargs.get("verify_extra") or [{}] * len(completions)
    if len(refs) != len(completions) or len(extras) != len(completions):
        raise ValueError("resources_server_ref and verify_extra need one entry per completion")
    try:
        key, verifier = _verifier_for(kwargs)
    except NemoGymError as exc:
        results = [VerifyResult(status=RolloutStatus.TRANSPORT_ERROR, error=str(exc))] * len(
            completions
        )
        _report(verify_stats.record(results), len(results))
        return [0.0] * len(completions)
    rows = []
    for ref, extra in zip(refs, extras, strict=True):
        row = {k: v for k, v in (extra or {}).items() if v is not None}
        if isinstance(ref, Mapping) and ref:
            row[RESOURCES_SERVER_REF] = dict(ref)
        rows.append(row)
    results = verifier.score(rows, [completion or "" for completion in completions])
    if key[0] == "head" and any(r.status is RolloutStatus.TRANSPORT_ERROR for r in results):
        _forget(key, verifier)
    _report(verify_stats.record(results), len(results))
    return [r.reward if r.reward is not None else 0.0 for r in results]


def _report(failed: Sequence[VerifyResult], total: int) -> None:
    if not failed:
        return
    reasons = collections.Counter(f"{r.status.value}: {r.error}" for r in failed)
    detail = "; ".join(
        f"{reason} (x{count})" if count > 1 else reason for reason, count in reasons.most_common(3)
    )
    more = f"; and {len(reasons) - 3} other reasons" if len(reasons) > 3 else ""
    logger.warning(
        "reward_nemo_gym_verify scored %d of %d completions 0.0 because it could not score "
        "them: %s%s",
        len(failed),
        total,
        detail,
        more,
    )
