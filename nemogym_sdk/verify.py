"""Scoring completions on NeMo Gym resources servers: ``/seed_session`` then ``/verify``.

``Verifier`` sends, per completion and concurrently: ``POST /seed_session`` with the
row (environments that keep state key it by the session cookie this sets), then
``POST /verify`` with the row, its ``responses_create_params`` untouched (tools, system
prompt, metadata), and a well-formed Responses-API ``response`` built from the
completion, carrying the session cookie. Each completion has its own cookie jar.

``reward_nemo_gym_verify`` is the fixed-name reward function with the seed's behaviour
(an unknown server or a failed call scores 0.0); use ``Verifier`` directly to tell
failures from real zeros.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import time
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from nemogym_sdk._aio import Attempt, Outcome, post_with_retries
from nemogym_sdk._session import SessionOwner
from nemogym_sdk.directory import DEFAULT_HEAD, ServerDirectory
from nemogym_sdk.errors import DiscoveryError, NemoGymError
from nemogym_sdk.policy import RetryPolicy, Timeouts
from nemogym_sdk.records import RolloutStatus
from nemogym_sdk.wire import RESPONSES_CREATE_PARAMS, build_response, build_verify_body

__all__ = ["Verifier", "VerifyItem", "VerifyResult", "reward_nemo_gym_verify"]

HEAD_ENV_VAR = "NEMOGYM_HEAD_URL"
"""Where ``reward_nemo_gym_verify`` looks for the head server when not told."""

_STATUS = {
    Outcome.HTTP_ERROR: RolloutStatus.AGENT_ERROR,
    Outcome.CONNECTION: RolloutStatus.TRANSPORT_ERROR,
    Outcome.PROTOCOL: RolloutStatus.TRANSPORT_ERROR,
    Outcome.TIMEOUT: RolloutStatus.TIMEOUT,
}


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
    try:
        data = json.loads(body)
    except ValueError:
        return VerifyResult(
            status=RolloutStatus.INVALID, error=f"/verify returned non-JSON {body[:100]!r}"
        )
    reward = data.get("reward") if isinstance(data, dict) else None
    if (
        not isinstance(reward, (int, float))
        or isinstance(reward, bool)
        or not math.isfinite(reward)
    ):
        return VerifyResult(
            status=RolloutStatus.INVALID, error="/verify returned no numeric reward"
        )
    components = data.get("reward_components")
    return VerifyResult(
        status=RolloutStatus.MASKED if data.get("mask_sample") is True else RolloutStatus.OK,
        reward=float(reward),
        reward_components={
            str(k): float(v)
            for k, v in (components.items() if isinstance(components, dict) else [])
            if isinstance(v, (int, float)) and not isinstance(v, bool)
        },
        mask_sample=data.get("mask_sample") is True,
        response=data,
    )


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
        self.directory = (
            servers
            if isinstance(servers, ServerDirectory)
            else ServerDirectory.from_urls(resources_servers=servers)
        )
        self.model_name = model_name
        self.seed_session = seed_session

    async def _post(
        self,
        url: str,
        body: bytes,
        cookies: Mapping[str, str],
        deadline: float | None,
        *,
        want_cookies: bool = False,
    ) -> Attempt:
        return await post_with_retries(
            self._bind(),
            url,
            body,
            request_timeout=self.timeouts.request,
            connect_timeout=self.timeouts.connect,
            deadline=deadline,
            retry=self.retry,
            rng=self._rng,
            cookies=cookies,
            want_cookies=want_cookies,
        )

    async def _one(self, item: VerifyItem, deadline: float | None) -> VerifyResult:
        try:
            base = self.directory.resources_url(item.resources_server)
        except DiscoveryError as exc:
            return VerifyResult(status=RolloutStatus.INVALID, error=str(exc))
        params = item.row.get(RESPONSES_CREATE_PARAMS)
        tools = params.get("tools", []) if isinstance(params, Mapping) else []
        try:
            response = build_response(item.completion, model=self.model_name, tools=tools or [])
            seed_body = json.dumps(dict(item.row)).encode()
            verify_body = json.dumps(build_verify_body(item.row, response)).encode()
        except (TypeError, ValueError, AttributeError) as exc:
            return VerifyResult(status=RolloutStatus.INVALID, error=f"cannot encode: {exc}")
        async with self._slot(base):
            cookies: dict[str, str] = {}
            if self.seed_session:
                seeded = await self._post(
                    f"{base}/seed_session", seed_body, cookies, deadline, want_cookies=True
                )
                if not seeded.ok:
                    return VerifyResult(status=_STATUS[seeded.outcome], error=seeded.error)
                cookies.update(seeded.cookies)
            answer = await self._post(f"{base}/verify", verify_body, cookies, deadline)
        if not answer.ok:
            return VerifyResult(status=_STATUS[answer.outcome], error=answer.error)
        return _verdict(answer.body)

    async def verify(self, items: Sequence[VerifyItem]) -> list[VerifyResult]:
        """Score every item concurrently; results in input order, failures as results."""
        self._bind()
        total = self.timeouts.total
        deadline = None if total is None else time.monotonic() + total
        return list(await asyncio.gather(*(self._one(item, deadline) for item in items)))

    def verify_sync(self, items: Sequence[VerifyItem]) -> list[VerifyResult]:
        """``verify`` for synchronous callers, on the verifier's own loop thread."""
        return self._run_sync(self.verify(list(items)))


def _servers_for(kwargs: Mapping[str, Any]) -> Mapping[str, str] | ServerDirectory:
    if kwargs.get("directory") is not None:
        directory = kwargs["directory"]
        assert isinstance(directory, ServerDirectory)
        return directory
    if kwargs.get("servers") is not None:
        servers = kwargs["servers"]
        assert isinstance(servers, Mapping)
        return servers
    head = kwargs.get("head") or os.environ.get(HEAD_ENV_VAR) or DEFAULT_HEAD
    return ServerDirectory.from_head(str(head))


def reward_nemo_gym_verify(
    completions: Sequence[Any], prompts: Sequence[Any] | None = None, **kwargs: Any
) -> list[float]:
    """Score each completion on its row's resources server (``/seed_session`` + ``/verify``).

    Keyword arguments (TRL passes dataset columns as per-row lists):
        resources_server_ref: per completion, ``{"name": <resources server instance>}``.
        verify_extra: per completion, the dataset row (``responses_create_params`` + task
            fields); ``{}`` when absent.
        servers: resources server name -> URL; or ``directory``: a ``ServerDirectory``; or
            ``head``: the head server (else ``$NEMOGYM_HEAD_URL``, else 127.0.0.1:11000).
        model_name: ``model`` of the built Responses object.

    Returns one float per completion. As in the seed, an unknown server, a failed call or
    an unreachable head gives 0.0 (use ``Verifier`` to tell failures from zeros).
    """
    refs = kwargs.get("resources_server_ref") or [{}] * len(completions)
    extras = kwargs.get("verify_extra") or [{}] * len(completions)
    if len(refs) != len(completions) or len(extras) != len(completions):
        raise ValueError("resources_server_ref and verify_extra need one entry per completion")
    try:
        servers = _servers_for(kwargs)
    except NemoGymError:
        return [0.0] * len(completions)
    items = []
    for completion, ref, extra in zip(completions, refs, extras, strict=True):
        name = ref.get("name") if isinstance(ref, Mapping) else None
        row = {k: v for k, v in (extra or {}).items() if v is not None}
        items.append(VerifyItem(resources_server=str(name), row=row, completion=completion or ""))
    with Verifier(servers, model_name=str(kwargs.get("model_name", "policy"))) as verifier:
        results = verifier.verify_sync(items)
    return [r.reward if r.reward is not None else 0.0 for r in results]
