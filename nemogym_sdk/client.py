"""``AgentClient``: play rollouts on NeMo Gym agents (``POST /run``), many at a time.

- One ``aiohttp.ClientSession`` reused across batches; global and per-host limits.
- Separate connect, per-request and whole-batch deadlines (``Timeouts``).
- Capped exponential backoff with jitter on connection errors, 429 and 5xx only.
- No cookie is shared between rollouts (NeMo Gym keys environment state by cookie).
- Rows route by ``agent_ref.name``; rows without one go to the default agent; an
  unknown name raises ``UnknownAgentError`` before anything is sent.
- Every requested rollout comes back, as a result or a typed failure, tagged with its
  row id and repeat index: in input order (``run``) or as they complete (``stream``).
- ``run_sync`` serves trainers that are not async, on one loop thread the client owns.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncGenerator, Iterable, Mapping, Sequence
from typing import Any, NamedTuple

import attrs

from nemogym_sdk._session import STATUS_OF, SessionOwner
from nemogym_sdk.directory import ServerDirectory
from nemogym_sdk.errors import ConfigError, DataError, UnknownAgentError
from nemogym_sdk.policy import RetryPolicy, SamplingParams, Timeouts
from nemogym_sdk.records import (
    DriftPolicy,
    ParseOptions,
    Rollout,
    RolloutRequest,
    RolloutStatus,
    TaskRow,
)
from nemogym_sdk.turns import Decode, parse_agent_response
from nemogym_sdk.wire import RUN_ROUTE, build_run_body

__all__ = ["AgentClient", "RawRun", "RowInput"]

logger = logging.getLogger(__name__)

RowInput = TaskRow | RolloutRequest | Mapping[str, Any]
"""A row to play: a ``TaskRow``, an already expanded ``RolloutRequest``, or a raw row dict."""


@attrs.frozen(kw_only=True)
class RawRun:
    """One ``/run`` exchange before parsing."""

    request: RolloutRequest
    """The row and repeat index that was played."""
    index: int
    """Position in the expanded input (row-major, then repeat index)."""
    agent_name: str
    """Agent instance the row was routed to."""
    status: RolloutStatus
    """``OK`` when a 2xx body arrived; otherwise why not."""
    body: bytes | None = attrs.field(default=None, repr=False)
    """The raw JSON body of a 2xx answer."""
    error: str | None = None
    """Why it failed, as a sentence."""
    http_status: int = 0
    """The last HTTP status (0 if no answer)."""
    attempts: int = 0
    """Attempts made, retries included."""
    seconds: float = 0.0
    """Wall time from start of the first attempt to the end of the last."""

    def json(self) -> Any:
        """The decoded body (None when there is none)."""
        return None if self.body is None else json.loads(self.body)


class _Job(NamedTuple):
    position: int
    request: RolloutRequest
    agent_name: str
    url: str
    """``<agent base URL>/run``."""
    body: bytes
    """The encoded ``/run`` body (encoded before anything is sent)."""


class AgentClient(SessionOwner):
    """Concurrent, retried, deadline-bounded ``/run`` calls to NeMo Gym agents.

    Example::

        directory = ServerDirectory.from_head("127.0.0.1:11000")
        async with AgentClient(directory, sampling=SamplingParams(temperature=1.0)) as client:
            rollouts = await client.run(rows, eos_token_id=tok.eos_token_id, num_generations=8)

    Args:
        agents: agent instance name -> URL, or a ``ServerDirectory``.
        default_agent: agent for rows without ``agent_ref``; defaults to the only agent
            when there is exactly one.
        sampling: sampling parameters forced onto every row (see ``SamplingParams``).
        timeouts: connect / per-request / whole-batch deadlines.
        retry: retry policy for connection errors, 429 and 5xx.
        max_concurrency: rollouts in flight at once, over all agents.
        max_per_host: rollouts in flight at once per agent host:port.
        seed: seed of the backoff jitter.
    """

    _thread_name = "nemogym-sdk-agents"

    def __init__(
        self,
        agents: Mapping[str, str] | ServerDirectory,
        *,
        default_agent: str | None = None,
        sampling: SamplingParams = SamplingParams(),
        timeouts: Timeouts = Timeouts(),
        retry: RetryPolicy = RetryPolicy(),
        max_concurrency: int = 256,
        max_per_host: int = 128,
        seed: int | None = None,
    ) -> None:
        super().__init__(
            timeouts=timeouts,
            retry=retry,
            max_concurrency=max_concurrency,
            max_per_host=max_per_host,
            seed=seed,
        )
        directory = (
            agents
            if isinstance(agents, ServerDirectory)
            else ServerDirectory.from_urls(agents=agents)
        )
        self.directory = directory
        self.sampling = sampling
        known = directory.agents
        if default_agent is None and len(known) == 1:
            default_agent = next(iter(known))
        if default_agent is not None:
            directory.agent_url(default_agent)  # unknown default -> UnknownAgentError now
        self.default_agent = default_agent

    # --- planning ---------------------------------------------------------------------------

    def _route(self, request: RolloutRequest) -> str:
        name = request.row.agent_name or self.default_agent
        if name is None:
            raise UnknownAgentError(
                f"row {request.row.row_id} has no agent_ref.name and no default agent is set; "
                f"known agents: {', '.join(self.directory.agents) or '(none)'}"
            )
        return name

    def plan(self, rows: Iterable[RowInput], num_generations: int = 1) -> list[RolloutRequest]:
        """Expand rows into ``num_generations`` requests each (``aabb`` order).

        ``RolloutRequest`` inputs are taken as already expanded; raw dict rows get ids
        ``row:<index>``.
        """
        if num_generations < 1:
            raise ConfigError(f"num_generations must be >= 1, got {num_generations}")
        requests: list[RolloutRequest] = []
        for index, row in enumerate(rows):
            if isinstance(row, RolloutRequest):
                requests.append(row)
                continue
            if not isinstance(row, TaskRow):
                row = TaskRow(row_id=f"row:{index}", data=row)
            requests += [RolloutRequest(row=row, repeat_index=i) for i in range(num_generations)]
        return requests

    def _jobs(self, requests: Sequence[RolloutRequest]) -> list[_Job]:
        """Route and encode every request; raises before anything is sent."""
        overrides = self.sampling.overrides()
        urls = {name: f"{url}{RUN_ROUTE}" for name, url in self.directory.agents.items()}
        jobs = []
        for index, request in enumerate(requests):
            name = self._route(request)
            if name not in urls:
                self.directory.agent_url(name)  # raises UnknownAgentError naming the agents
            try:
                body = json.dumps(build_run_body(request.row.data, overrides)).encode()
            except (TypeError, ValueError) as exc:
                raise DataError(f"row {request.row.row_id} cannot be sent as JSON: {exc}") from exc
            jobs.append(_Job(index, request, name, urls[name], body))
        return jobs

    # --- raw runs ---------------------------------------------------------------------------

    async def _play(self, job: _Job, deadline: float | None) -> RawRun:
        per_host, everyone = self._limits(job.url)
        started = time.monotonic()
        if per_host is None:  # the per-host limit cannot bind: skip it (hot path)
            async with everyone:
                attempt = await self._send(job.url, job.body, deadline)
        else:
            async with per_host, everyone:
                attempt = await self._send(job.url, job.body, deadline)
        error = attempt.error
        if error is not None and attempt.attempts > 1:
            error = f"{error} (after {attempt.attempts} attempts)"
            logger.debug("row %s: %s", job.request.row.row_id, error)
        return RawRun(
            request=job.request,
            index=job.position,
            agent_name=job.agent_name,
            status=STATUS_OF[attempt.outcome],
            body=attempt.body if attempt.ok else None,
            error=error,
            http_status=attempt.status,
            attempts=attempt.attempts,
            seconds=time.monotonic() - started,
        )

    async def run_raw(self, rows: Iterable[RowInput], *, num_generations: int = 1) -> list[RawRun]:
        """Play every row ``num_generations`` times; unparsed exchanges in input order."""
        jobs = self._jobs(self.plan(rows, num_generations))
        self._bind()
        deadline = self._deadline()
        tasks = [asyncio.ensure_future(self._play(job, deadline)) for job in jobs]
        try:
            return list(await asyncio.gather(*tasks))
        finally:
            for task in tasks:
                task.cancel()

    async def stream_raw(
        self, rows: Iterable[RowInput], *, num_generations: int = 1
    ) -> AsyncGenerator[RawRun, None]:
        """Play every row ``num_generations`` times; yield each exchange as it completes.

        Closing the generator early (``break``, ``aclose``) cancels what is still running.
        """
        jobs = self._jobs(self.plan(rows, num_generations))
        self._bind()
        deadline = self._deadline()
        tasks = [asyncio.ensure_future(self._play(job, deadline)) for job in jobs]
        try:
            for next_done in asyncio.as_completed(tasks):
                yield await next_done
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    # --- rollouts ---------------------------------------------------------------------------

    @staticmethod
    def to_rollout(
        raw: RawRun,
        eos_token_id: int,
        *,
        on_drift: DriftPolicy | str = DriftPolicy.MARK,
        max_completion_length: int | None = None,
        decode: Decode | None = None,
        parse_options: ParseOptions | None = None,
    ) -> Rollout:
        """Parse one exchange into a ``Rollout`` tagged with its row, repeat and agent.

        ``parse_options`` carries ``on_drift``, ``max_completion_length`` and ``decode``
        as one record; pass either it or those keywords.
        """
        options = _options(parse_options, on_drift, max_completion_length, decode)
        return _to_rollout(raw, eos_token_id, options)

    async def stream(
        self,
        rows: Iterable[RowInput],
        *,
        eos_token_id: int,
        num_generations: int = 1,
        on_drift: DriftPolicy | str = DriftPolicy.MARK,
        max_completion_length: int | None = None,
        decode: Decode | None = None,
        parse_options: ParseOptions | None = None,
    ) -> AsyncGenerator[Rollout, None]:
        """Yield rollouts as they complete (each tagged with ``row_id`` and ``repeat_index``).

        Closing the generator early (``break``, ``aclose``) cancels what is still running.
        """
        options = _options(parse_options, on_drift, max_completion_length, decode)
        raws = self.stream_raw(rows, num_generations=num_generations)
        async with contextlib.aclosing(raws):
            async for raw in raws:
                yield _to_rollout(raw, eos_token_id, options)

    async def run(
        self,
        rows: Iterable[RowInput],
        *,
        eos_token_id: int,
        num_generations: int = 1,
        on_drift: DriftPolicy | str = DriftPolicy.MARK,
        max_completion_length: int | None = None,
        decode: Decode | None = None,
        parse_options: ParseOptions | None = None,
    ) -> list[Rollout]:
        """Play every row ``num_generations`` times; rollouts in input order (``aabb``)."""
        options = _options(parse_options, on_drift, max_completion_length, decode)
        raws = await self.run_raw(rows, num_generations=num_generations)
        return [_to_rollout(raw, eos_token_id, options) for raw in raws]

    def run_sync(
        self,
        rows: Iterable[RowInput],
        *,
        eos_token_id: int,
        num_generations: int = 1,
        on_drift: DriftPolicy | str = DriftPolicy.MARK,
        max_completion_length: int | None = None,
        decode: Decode | None = None,
        parse_options: ParseOptions | None = None,
    ) -> list[Rollout]:
        """``run`` for synchronous callers, on the client's own loop thread."""
        options = _options(parse_options, on_drift, max_completion_length, decode)
        rows = list(rows)
        return self._run_sync(
            self.run(
                rows,
                eos_token_id=eos_token_id,
                num_generations=num_generations,
                parse_options=options,
            )
        )

    def run_raw_sync(self, rows: Iterable[RowInput], *, num_generations: int = 1) -> list[RawRun]:
        """``run_raw`` for synchronous callers, on the client's own loop thread."""
        return self._run_sync(self.run_raw(list(rows), num_generations=num_generations))


_DEFAULT_PARSE = ParseOptions()


def _options(
    given: ParseOptions | None,
    on_drift: DriftPolicy | str,
    max_completion_length: int | None,
    decode: Decode | None,
) -> ParseOptions:
    """The one parse-options record, from ``parse_options`` or from the loose keywords."""
    loose = ParseOptions(
        on_drift=on_drift, max_completion_length=max_completion_length, decode=decode
    )
    if given is None:
        return loose
    if loose != _DEFAULT_PARSE or decode is not None:
        raise ConfigError(
            "pass either parse_options or on_drift/max_completion_length/decode, not both"
        )
    return given


def _to_rollout(raw: RawRun, eos_token_id: int, options: ParseOptions) -> Rollout:
    if raw.body is None:
        rollout = Rollout.failed(raw.status, eos_token_id, error=raw.error)
    else:
        rollout = parse_agent_response(
            raw.body,
            eos_token_id,
            on_drift=options.on_drift,
            max_completion_length=options.max_completion_length,
            decode=options.decode,
        )
    row_id, repeat, agent = raw.request.row.row_id, raw.request.repeat_index, raw.agent_name
    forks = tuple(
        attrs.evolve(fork, row_id=row_id, repeat_index=repeat, agent_name=agent)
        for fork in rollout.forks
    )
    return attrs.evolve(rollout, forks=forks, row_id=row_id, repeat_index=repeat, agent_name=agent)
