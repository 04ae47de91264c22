"""The connection-owning base of ``AgentClient`` and ``Verifier``.

One ``aiohttp.ClientSession`` per client, created lazily in the event loop that first
uses it and reused for every batch; a global and a per-host concurrency limit; the one
retry/deadline/status path both clients send through (``_deadline``, ``_send``,
``STATUS_OF``); and a private background loop for the synchronous facades (created on
first sync use, so a purely async user never starts a thread).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import AsyncIterator, Coroutine, Mapping
from types import TracebackType
from typing import Any, Self, TypeVar
from urllib.parse import urlsplit

import aiohttp

from nemogym_sdk._net.aio import Attempt, BackgroundLoop, Outcome, post_with_retries
from nemogym_sdk.errors import ConfigError, UsageError
from nemogym_sdk.policy import RetryPolicy, Timeouts
from nemogym_sdk.records import RolloutStatus

T = TypeVar("T")

STATUS_OF: Mapping[Outcome, RolloutStatus] = {
    Outcome.OK: RolloutStatus.OK,
    Outcome.HTTP_ERROR: RolloutStatus.AGENT_ERROR,
    Outcome.CONNECTION: RolloutStatus.TRANSPORT_ERROR,
    Outcome.PROTOCOL: RolloutStatus.TRANSPORT_ERROR,
    Outcome.TIMEOUT: RolloutStatus.TIMEOUT,
}
"""The rollout status of each way an exchange can end (agents and resources servers alike)."""


class SessionOwner:
    """Owns a session, its concurrency limits and (for sync callers) a loop thread."""

    _thread_name = "nemogym-sdk-http"

    def __init__(
        self,
        *,
        timeouts: Timeouts,
        retry: RetryPolicy,
        max_concurrency: int,
        max_per_host: int,
        seed: int | None,
    ) -> None:
        if max_concurrency < 1 or max_per_host < 1:
            raise ConfigError(
                "max_concurrency and max_per_host must be >= 1, got "
                f"{max_concurrency} and {max_per_host}"
            )
        self.timeouts = timeouts
        self.retry = retry
        self.max_concurrency = max_concurrency
        self.max_per_host = max_per_host
        self._rng = random.Random(seed)
        self._session: aiohttp.ClientSession | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._background: BackgroundLoop | None = None
        self._global: asyncio.Semaphore | None = None
        self._per_host: dict[str, asyncio.Semaphore] = {}
        self._limit_cache: dict[str, tuple[asyncio.Semaphore | None, asyncio.Semaphore]] = {}
        self._closed = False

    # --- session ----------------------------------------------------------------------------

    def _bind(self) -> aiohttp.ClientSession:
        """The session of the running loop, created on first use."""
        if self._closed:
            raise UsageError(f"this {type(self).__name__} is closed")
        loop = asyncio.get_running_loop()
        if self._loop is None:
            self._loop = loop
            connector = aiohttp.TCPConnector(limit=0, limit_per_host=0, enable_cleanup_closed=True)
            self._session = aiohttp.ClientSession(
                connector=connector,
                cookie_jar=aiohttp.DummyCookieJar(),  # cookies live per rollout, never shared
                timeout=aiohttp.ClientTimeout(total=None),
            )
            self._global = asyncio.Semaphore(self.max_concurrency)
        elif loop is not self._loop:
            raise ConfigError(
                f"this {type(self).__name__} is bound to another event loop: use one client "
                "per loop (the *_sync methods run on the client's own loop)"
            )
        assert self._session is not None
        return self._session

    def _limits(self, url: str) -> tuple[asyncio.Semaphore | None, asyncio.Semaphore]:
        """The per-host and the global semaphore for ``url``, in the order to take them.

        The per-host slot is taken first: a job waiting for a saturated host must not
        hold a global slot that a job for another host could use. When the per-host
        limit is not below the global one it can never bind: None then.
        """
        limits = self._limit_cache.get(url)
        if limits is None:
            assert self._global is not None
            per_host: asyncio.Semaphore | None
            if self.max_per_host >= self.max_concurrency:
                per_host = None
            else:
                host = urlsplit(url).netloc
                per_host = self._per_host.get(host) or self._per_host.setdefault(
                    host, asyncio.Semaphore(self.max_per_host)
                )
            limits = self._limit_cache[url] = (per_host, self._global)
        return limits

    # --- sending ----------------------------------------------------------------------------

    def _deadline(self) -> float | None:
        """The absolute ``time.monotonic()`` deadline of a batch starting now (None: none)."""
        total = self.timeouts.total
        return None if total is None else time.monotonic() + total

    async def _send(
        self,
        url: str,
        body: bytes,
        deadline: float | None,
        *,
        cookies: Mapping[str, str] | None = None,
        want_cookies: bool = False,
    ) -> Attempt:
        """POST ``body`` to ``url`` under this client's timeouts and retry policy, never
        past ``deadline``; a batch deadline that has already passed sends nothing."""
        if deadline is not None and time.monotonic() >= deadline:
            return Attempt(
                outcome=Outcome.TIMEOUT, attempts=0, error="the batch deadline passed first"
            )
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

    # --- sync facade ------------------------------------------------------------------------

    def _run_sync(self, coroutine: Coroutine[Any, Any, T]) -> T:
        try:
            background = self._background_loop()
        except ConfigError:
            coroutine.close()
            raise
        return background.run(coroutine)

    def _background_loop(self) -> BackgroundLoop:
        """The loop thread the synchronous facade (and ``RolloutEngine``) plays on, started
        on first use; closed with the client."""
        if self._background is None:
            if self._loop is not None:
                raise ConfigError(
                    f"this {type(self).__name__} is already used from an async loop; "
                    "use its async methods there"
                )
            self._background = BackgroundLoop(self._thread_name)
        return self._background

    # --- lifecycle --------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def _slot(self, url: str) -> AsyncIterator[None]:
        """Hold a per-host (when it can bind) and a global slot for a request to ``url``."""
        per_host, everyone = self._limits(url)
        if per_host is None:
            async with everyone:
                yield
        else:
            async with per_host, everyone:
                yield

    async def aclose(self) -> None:
        """Close the session (from the loop that uses it)."""
        session, self._session = self._session, None
        if session is not None:
            await session.close()
        self._closed = True

    def close(self) -> None:
        """Close the session and stop the background loop, if the sync facade started one."""
        if self._background is not None:
            if self._session is not None:
                self._background.run(self.aclose())
            self._background.close()
            self._background = None
        elif self._session is not None and self._loop is not None and not self._loop.is_closed():
            if self._loop.is_running():
                raise UsageError("an async client must be closed with 'await client.aclose()'")
            self._loop.run_until_complete(self.aclose())
        self._closed = True

    async def __aenter__(self) -> Self:
        self._bind()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.aclose()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()
