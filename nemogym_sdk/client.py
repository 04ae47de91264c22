"""``AgentClient``: play rollouts on NeMo Gym agents (``POST /run``), many at a time.

- One ``aiohttp.ClientSession`` reused across batches; global and per-host limits.
- Separate connect, per-request and whole-batch deadlines (``Timeouts``).
- Capped exponential backoff with jitter on connection errors, 429 and 5xx only.
- No cookie is shared between rollouts (NeMo Gym keys environment state by cookie).
- Rows route by ``agent_ref.name``; rows without one go to the deployment's default
  agent (``ServerDirectory.default_agent``); an unknown name raises
  ``UnknownAgentError`` before anything is sent.
- Several deployments (a list of ``ServerDirectory``): a row goes to a deployment that runs
  its agent, the one with the fewest of the client's rollouts in flight; a deployment that
  refuses connections is skipped for a while and the rollout is sent to another (the
  episode never started there), so a deployment that goes away costs typed failures at
  most, never a hang (``nemogym_sdk._net.balance``).
- Every requested rollout comes back, as a result or a typed failure, tagged with its
  row id and repeat index: in input order (``run``, ``run_sync``) or as they complete
  (``stream``). Each result is parsed as soon as it arrives, while the others play.
- With ``group_affinity`` every rollout of a row carries the row id as its affinity key
  (``nemogym_sdk.wire.with_affinity``), so a router in front of several samplers sends a
  group's rollouts to one replica.
- With ``sampler_url`` (the ``nemogym_sdk.serve`` sampler behind NeMo Gym's model server)
  every rollout carries an episode id (``nemogym_sdk.wire.with_episode``), and one the
  client gives up on (its deadline passed, it was cancelled, it failed for good) is aborted
  there (``POST /abort_episode``): NeMo Gym's agent would otherwise play it to its end, the
  sampler generating for nobody.
- ``run_sync`` (play and parse) serves trainers that are not async, on one loop thread
  the client owns; ``run_raw`` / ``run_raw_sync`` give the unparsed exchanges
  (``RawRun``) to users who parse ``/run`` bodies themselves.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncGenerator, Coroutine, Iterable, Mapping, Sequence
from typing import Any, NamedTuple, TypeVar
from urllib.parse import quote

import aiohttp
import attrs
import orjson

from nemogym_sdk._net.aio import Attempt, Outcome, post
from nemogym_sdk._net.balance import Balancer
from nemogym_sdk._net.session import STATUS_OF, SessionOwner
from nemogym_sdk.directory import ServerDirectory
from nemogym_sdk.errors import ConfigError, DataError, UnknownAgentError
from nemogym_sdk.hosts import server_root
from nemogym_sdk.policy import RetryPolicy, SamplingParams, Timeouts
from nemogym_sdk.records import ParseOptions, Rollout, RolloutRequest, RolloutStatus, TaskRow
from nemogym_sdk.turns import parse_agent_response, stamp
from nemogym_sdk.wire import (
    ABORT_EPISODE_ROUTE,
    AGENTS,
    EPISODE_ID_PARAM,
    RUN_ROUTE,
    build_run_body,
    with_affinity,
    with_episode,
    with_seed,
)

__all__ = ["AgentClient", "RawRun", "RowInput"]

logger = logging.getLogger(__name__)

RowInput = TaskRow | RolloutRequest | Mapping[str, Any]
"""A row to play: a ``TaskRow``, an already expanded ``RolloutRequest``, or a raw row dict."""

_DEFAULT_PARSE = ParseOptions()


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
    url: str = ""
    """The agent's ``/run`` URL the last attempt went to (which deployment played it)."""

    def json(self) -> Any:
        """The decoded body (None when there is none)."""
        return None if self.body is None else json.loads(self.body)

    def rollout(self, eos_token_id: int, parse: ParseOptions = _DEFAULT_PARSE) -> Rollout:
        """This exchange as a ``Rollout`` tagged with its row id, repeat index and agent
        (a failed exchange is a failed rollout with its status and reason)."""
        if self.body is None:
            rollout = Rollout.failed(self.status, eos_token_id, error=self.error)
        else:
            rollout = parse_agent_response(
                self.body,
                eos_token_id,
                on_drift=parse.on_drift,
                max_completion_length=parse.max_completion_length,
                decode=parse.decode,
            )
        return stamp(
            rollout,
            row_id=self.request.row.row_id,
            repeat_index=self.request.repeat_index,
            agent_name=self.agent_name,
        )


_ABORT_TIMEOUT = aiohttp.ClientTimeout(total=5.0, sock_connect=5.0)
"""An abort is a short request to the sampler; one that cannot be sent in time is dropped."""


class _Job(NamedTuple):
    position: int
    request: RolloutRequest
    agent_name: str
    urls: tuple[str, ...]
    """``<agent base URL>/run`` in each deployment that runs the agent."""
    body: bytes
    """The encoded ``/run`` body (encoded before anything is sent)."""
    episode: str | None = None
    """The episode id its model requests carry, where the client aborts it when it gives up
    on it (``sampler_url`` set), or None."""


class AgentClient(SessionOwner):
    """Concurrent, retried, deadline-bounded ``/run`` calls to NeMo Gym agents.

    Example::

        directory = ServerDirectory.from_head("127.0.0.1:11000")
        with AgentClient(directory, sampling=SamplingParams(temperature=1.0)) as client:
            rollouts = client.run_sync(rows, eos_token_id=tok.eos_token_id, num_generations=8)

    Args:
        agents: a ``ServerDirectory``, or agent instance name -> URL; or a list of
            ``ServerDirectory``, several deployments played together (each row goes to one
            that runs its agent, balanced, failing over when one refuses connections).
        default_agent: agent for rows without ``agent_ref``; default the directory's
            (``ServerDirectory.default_agent``: the only agent when there is one).
        sampling: sampling parameters forced onto every row (see ``SamplingParams``);
            pass the same record to the learner (``adapters.torch.train_step``).
        timeouts: connect / per-request / whole-batch deadlines.
        retry: retry policy for connection errors, 429 and 5xx.
        max_concurrency: rollouts in flight at once, over all agents.
        max_per_host: rollouts in flight at once per agent host:port.
        seed: seed of the backoff jitter.
        group_affinity: send each row's rollouts with its row id as affinity key, so that
            ``vllm-router`` in front of several sampler replicas keeps a group on one.
        sampler_url: the ``nemogym_sdk.serve`` sampler NeMo Gym's model server generates
            from (its base URL, ``/v1`` or not): each rollout then carries an episode id,
            and one the client gives up on is aborted there, its generation in flight
            stopped and its later turns refused (``nemogym_sdk.serve.episodes``).
    """

    _thread_name = "nemogym-sdk-agents"

    def __init__(
        self,
        agents: Mapping[str, str] | ServerDirectory | Sequence[ServerDirectory],
        *,
        default_agent: str | None = None,
        sampling: SamplingParams = SamplingParams(),
        timeouts: Timeouts = Timeouts(),
        retry: RetryPolicy = RetryPolicy(),
        max_concurrency: int = 256,
        max_per_host: int = 128,
        seed: int | None = None,
        group_affinity: bool = False,
        sampler_url: str | None = None,
    ) -> None:
        super().__init__(
            timeouts=timeouts,
            retry=retry,
            max_concurrency=max_concurrency,
            max_per_host=max_per_host,
            seed=seed,
        )
        deployments = (
            [ServerDirectory.of(agents, AGENTS)]
            if isinstance(agents, (Mapping, ServerDirectory))
            else list(agents)
        )
        if not deployments:
            raise ConfigError("AgentClient needs at least one deployment")
        if default_agent is not None:  # an unknown default is an UnknownAgentError now
            if not any(default_agent in d.agents for d in deployments):
                deployments[0].with_default_agent(default_agent)  # raises, naming the agents
            deployments = [
                d.with_default_agent(default_agent) if default_agent in d.agents else d
                for d in deployments
            ]
        self.deployments: tuple[ServerDirectory, ...] = tuple(deployments)
        """Every deployment the rows are played on."""
        self.directory = deployments[0]
        """The (first) deployment the rows are played on."""
        self._balancer = Balancer()
        self.sampling = sampling
        """The sampling parameters forced onto every row."""
        self.group_affinity = group_affinity
        """Whether each rollout carries its row id as the router's affinity key."""
        self.sampler_url = None if sampler_url is None else server_root(sampler_url)
        """Where an episode given up on is aborted (server root), or None."""
        self._aborting: set[asyncio.Task[None]] = set()

    @property
    def default_agent(self) -> str | None:
        """The agent rows without ``agent_ref`` go to (``ServerDirectory.default_agent``, of
        the first deployment that has one)."""
        return next((d.default_agent for d in self.deployments if d.default_agent), None)

    @property
    def agent_urls(self) -> dict[str, tuple[str, ...]]:
        """Agent name -> its base URL in each deployment that runs it."""
        urls: dict[str, list[str]] = {}
        for deployment in self.deployments:
            for name, url in deployment.agents.items():
                urls.setdefault(name, []).append(url)
        return {name: tuple(dict.fromkeys(found)) for name, found in urls.items()}

    @property
    def unreachable(self) -> list[str]:
        """Agent ``/run`` URLs that refused connections recently (skipped for a while)."""
        return self._balancer.down()

    # --- planning ---------------------------------------------------------------------------

    def _route(self, request: RolloutRequest) -> str:
        name = request.row.agent_name or self.default_agent
        if name is None:
            raise UnknownAgentError(
                f"row {request.row.row_id} has no agent_ref.name and no default agent is set; "
                f"known agents: {', '.join(self.agent_urls) or '(none)'}"
            )
        return name

    @staticmethod
    def _plan(rows: Iterable[RowInput], num_generations: int) -> list[RolloutRequest]:
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

    def _jobs(self, rows: Iterable[RowInput], num_generations: int) -> list[_Job]:
        """Expand, route and encode every request; raises before anything is sent."""
        overrides = self.sampling.overrides()
        urls = {
            name: tuple(f"{url}{RUN_ROUTE}" for url in found)
            for name, found in self.agent_urls.items()
        }
        jobs = []
        for index, request in enumerate(self._plan(rows, num_generations)):
            name = self._route(request)
            if name not in urls:
                raise UnknownAgentError(
                    f"no agent named {name!r}; known agents: {', '.join(urls) or '(none)'}"
                )
            data = request.row.data
            if self.group_affinity:
                data = with_affinity(data, request.row.row_id)
            episode = None
            if self.sampler_url is not None or request.seed is not None:
                # an id per episode: where to abort it, and what tells the sampler that
                # its turns share one seed (nemogym_sdk.serve.episodes.turn_seed)
                episode = f"{request.row.row_id}#{request.repeat_index}#{uuid.uuid4().hex[:12]}"
                data = with_episode(data, episode)
            if request.seed is not None:
                data = with_seed(data, request.seed)
            abortable = episode if self.sampler_url is not None else None
            try:
                body = orjson.dumps(build_run_body(data, overrides))
            except (TypeError, ValueError) as exc:
                raise DataError(f"row {request.row.row_id} cannot be sent as JSON: {exc}") from exc
            jobs.append(_Job(index, request, name, urls[name], body, abortable))
        return jobs

    def _start_batch(self) -> float | None:
        """Bind the session to the running loop; the batch's absolute deadline."""
        self._bind()
        return self._deadline()

    # --- one exchange ---------------------------------------------------------------------

    async def _attempt(self, url: str, body: bytes, deadline: float | None) -> Attempt:
        per_host, everyone = self._limits(url)
        if per_host is None:  # the per-host limit cannot bind: skip it (hot path)
            async with everyone:
                return await self._send(url, body, deadline)
        async with per_host, everyone:
            return await self._send(url, body, deadline)

    async def _play(self, job: _Job, deadline: float | None) -> RawRun:
        """Play ``job``; an episode the client gives up on (cancelled, or ended without an
        answer of the agent's) is aborted at the sampler, when there is one."""
        if job.episode is None:
            return await self._exchange(job, deadline)
        try:
            raw = await self._exchange(job, deadline)
        except asyncio.CancelledError:
            self._abort(job.episode)
            raise
        if raw.status is not RolloutStatus.OK:
            self._abort(job.episode)
        return raw

    def _abort(self, episode: str) -> None:
        """Abort ``episode`` at the sampler, in the background (the caller may be cancelled;
        ``aclose`` waits for it)."""
        task = asyncio.get_running_loop().create_task(self._post_abort(episode))
        self._aborting.add(task)
        task.add_done_callback(self._aborting.discard)

    async def _post_abort(self, episode: str) -> None:
        session = self._session
        if session is None or self.sampler_url is None:
            return
        url = f"{self.sampler_url}{ABORT_EPISODE_ROUTE}?{EPISODE_ID_PARAM}={quote(episode)}"
        answer = await post(session, url, b"{}", timeout=_ABORT_TIMEOUT)
        if not answer.ok:
            logger.debug("episode %s was not aborted at the sampler: %s", episode, answer.error)

    async def aclose(self) -> None:
        """Close the session, once the aborts of abandoned episodes were sent (5 s at most)."""
        if self._aborting:
            await asyncio.wait(set(self._aborting), timeout=_ABORT_TIMEOUT.total)
        await super().aclose()

    async def _exchange(self, job: _Job, deadline: float | None) -> RawRun:
        started = time.monotonic()
        if len(job.urls) == 1:  # one deployment runs the agent (hot path: no extra await)
            url = job.urls[0]
            per_host, everyone = self._limits(url)
            if per_host is None:  # the per-host limit cannot bind: skip it
                async with everyone:
                    attempt = await self._send(url, job.body, deadline)
            else:
                async with per_host, everyone:
                    attempt = await self._send(url, job.body, deadline)
            attempts, tried = attempt.attempts, 1
        else:
            url, attempt, attempts, tried = await self._play_balanced(job, deadline)
        error = attempt.error
        if error is not None and attempts > 1:
            where = f" ({tried} deployments)" if tried > 1 else ""
            error = f"{error} (after {attempts} attempts{where})"
            logger.debug("row %s: %s", job.request.row.row_id, error)
        return RawRun(
            request=job.request,
            index=job.position,
            agent_name=job.agent_name,
            status=STATUS_OF[attempt.outcome],
            body=attempt.body if attempt.ok else None,
            error=error,
            http_status=attempt.status,
            attempts=attempts,
            seconds=time.monotonic() - started,
            url=url,
        )

    async def _play_balanced(
        self, job: _Job, deadline: float | None
    ) -> tuple[str, Attempt, int, int]:
        """Play on the least busy deployment running the agent; on a refused connection (the
        episode never started there) mark it and try the next. (url, last attempt, attempts,
        deployments tried)."""
        tried: list[str] = []
        attempts = 0
        while True:
            url = self._balancer.pick(job.urls, tried)
            tried.append(url)
            with self._balancer.using(url):
                attempt = await self._attempt(url, job.body, deadline)
            attempts += attempt.attempts
            if attempt.outcome is not Outcome.CONNECTION:
                break
            self._balancer.failed(url)
            if len(tried) == len(job.urls):
                break
        return url, attempt, attempts, len(tried)

    async def _play_parsed(
        self, job: _Job, deadline: float | None, eos_token_id: int, parse: ParseOptions
    ) -> Rollout:
        """Play one job and parse it at once, while the other jobs are still playing."""
        return (await self._play(job, deadline)).rollout(eos_token_id, parse)

    # --- playing ----------------------------------------------------------------------------

    async def play(
        self,
        request: RolloutRequest,
        *,
        eos_token_id: int,
        parse: ParseOptions = _DEFAULT_PARSE,
        timeout: float | None = None,
    ) -> Rollout:
        """Play one rollout and parse it, under a deadline of its own: ``timeout`` seconds
        from now (``Timeouts.total``, when set, also counts from now; the earlier wins). A
        rollout still playing at its deadline comes back as a ``TIMEOUT`` failure.

        What ``RolloutEngine`` plays each episode with; ``run`` and ``stream`` share one
        deadline among a whole batch instead.
        """
        if timeout is not None and not timeout > 0:
            raise ConfigError(f"timeout must be > 0 seconds, got {timeout}")
        (job,) = self._jobs([request], 1)
        deadline = self._start_batch()
        if timeout is not None:
            own = time.monotonic() + timeout
            deadline = own if deadline is None else min(deadline, own)
        return await self._play_parsed(job, deadline, eos_token_id, parse)

    async def run(
        self,
        rows: Iterable[RowInput],
        *,
        eos_token_id: int,
        num_generations: int = 1,
        parse: ParseOptions = _DEFAULT_PARSE,
    ) -> list[Rollout]:
        """Play every row ``num_generations`` times; rollouts in input order (``aabb``).

        Args:
            rows: ``TaskRow``s (ids from ``load_rows``), ``RolloutRequest``s, or row dicts.
            eos_token_id: the one token of a failed rollout (the seed contract's shape).
            num_generations: rollouts per row (a GRPO group).
            parse: how ``/run`` results become rollouts (drift policy, truncation).
        """
        jobs = self._jobs(rows, num_generations)
        deadline = self._start_batch()
        return await _in_order(self._play_parsed(j, deadline, eos_token_id, parse) for j in jobs)

    async def stream(
        self,
        rows: Iterable[RowInput],
        *,
        eos_token_id: int,
        num_generations: int = 1,
        parse: ParseOptions = _DEFAULT_PARSE,
    ) -> AsyncGenerator[Rollout, None]:
        """Yield rollouts as they complete (each tagged with ``row_id`` and ``repeat_index``).

        Closing the generator early (``break``, ``aclose``) cancels what is still running.
        """
        jobs = self._jobs(rows, num_generations)
        deadline = self._start_batch()
        tasks = [
            asyncio.ensure_future(self._play_parsed(job, deadline, eos_token_id, parse))
            for job in jobs
        ]
        try:
            for next_done in asyncio.as_completed(tasks):
                yield await next_done
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    def run_sync(
        self,
        rows: Iterable[RowInput],
        *,
        eos_token_id: int,
        num_generations: int = 1,
        parse: ParseOptions = _DEFAULT_PARSE,
    ) -> list[Rollout]:
        """Play and parse: ``run`` for synchronous callers, on the client's own loop thread."""
        rows = list(rows)
        return self._run_sync(
            self.run(rows, eos_token_id=eos_token_id, num_generations=num_generations, parse=parse)
        )

    async def run_raw(self, rows: Iterable[RowInput], *, num_generations: int = 1) -> list[RawRun]:
        """Play every row ``num_generations`` times; the unparsed exchanges, in input order
        (``RawRun.rollout`` parses one)."""
        jobs = self._jobs(rows, num_generations)
        deadline = self._start_batch()
        return await _in_order(self._play(job, deadline) for job in jobs)

    def run_raw_sync(self, rows: Iterable[RowInput], *, num_generations: int = 1) -> list[RawRun]:
        """``run_raw`` for synchronous callers, on the client's own loop thread."""
        return self._run_sync(self.run_raw(list(rows), num_generations=num_generations))


T = TypeVar("T")


async def _in_order(coroutines: Iterable[Coroutine[Any, Any, T]]) -> list[T]:
    """Run the coroutines concurrently; their results in input order. If one raises (or
    the caller is cancelled), the others are cancelled."""
    tasks = [asyncio.ensure_future(coroutine) for coroutine in coroutines]
    try:
        return list(await asyncio.gather(*tasks))
    finally:
        for task in tasks:
            task.cancel()
