"""Shared asyncio plumbing for the network clients.

- ``BackgroundLoop``: one event loop on one daemon thread, owned by a client, so the
  synchronous facades reuse one loop and one ``aiohttp.ClientSession`` instead of
  creating a loop per call.
- ``post``: one HTTP attempt with the foreign-exception edge: every aiohttp and
  asyncio error is translated here into an ``Attempt`` outcome, nowhere else.
- ``post_with_retries``: the retry loop (capped exponential backoff with jitter on
  connection errors, 429 and 5xx only), bounded by an absolute deadline.
"""

from __future__ import annotations

import asyncio
import enum
import random
import threading
import time
from collections.abc import Awaitable, Coroutine, Mapping
from concurrent.futures import Future
from typing import Any, TypeVar

import aiohttp
import attrs

from nemogym_sdk.policy import RetryPolicy

T = TypeVar("T")

_BODY_PREVIEW = 300


class BackgroundLoop:
    """An event loop running on a private daemon thread."""

    def __init__(self, name: str) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=name, daemon=True)
        self._thread.start()

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    def submit(self, coroutine: Coroutine[Any, Any, T]) -> Future[T]:
        """Schedule ``coroutine`` on the loop; the caller waits on the future."""
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop)

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run ``coroutine`` on the loop and block until it finishes."""
        if threading.current_thread() is self._thread:
            coroutine.close()
            raise RuntimeError("a synchronous client method was called from its own loop thread")
        return self.submit(coroutine).result()

    def close(self) -> None:
        """Stop the loop and join its thread (idempotent)."""
        if self._loop.is_closed():
            return
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()


class Outcome(enum.Enum):
    """How one HTTP exchange ended."""

    OK = "ok"
    HTTP_ERROR = "http_error"
    CONNECTION = "connection"
    TIMEOUT = "timeout"


@attrs.frozen(kw_only=True)
class Attempt:
    """The result of one request, after retries."""

    outcome: Outcome
    status: int = 0
    """HTTP status (0 when no response arrived)."""
    body: bytes = b""
    """The full body for OK and HTTP errors."""
    cookies: Mapping[str, str] = attrs.field(factory=dict)
    """Cookies the server set (for a per-rollout jar)."""
    error: str | None = None
    """Why it failed, as a sentence."""
    attempts: int = 1
    """Attempts made, the first included."""
    retry_after: float | None = None
    """The server's ``Retry-After`` in seconds, when it sent one."""

    @property
    def ok(self) -> bool:
        return self.outcome is Outcome.OK


def _retry_after(headers: Mapping[str, str]) -> float | None:
    value = headers.get("Retry-After")
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


def _preview(body: bytes) -> str:
    text = body[:_BODY_PREVIEW].decode("utf-8", "replace")
    return text + ("..." if len(body) > _BODY_PREVIEW else "")


async def post(
    session: aiohttp.ClientSession,
    url: str,
    body: bytes,
    *,
    timeout: aiohttp.ClientTimeout,
    cookies: Mapping[str, str] | None = None,
) -> Attempt:
    """One POST of a JSON body; never raises for network or HTTP problems."""
    headers = {"Content-Type": "application/json"}
    try:
        async with session.post(
            url, data=body, headers=headers, timeout=timeout, cookies=cookies
        ) as response:
            payload = await response.read()
            if response.status >= 400:
                return Attempt(
                    outcome=Outcome.HTTP_ERROR,
                    status=response.status,
                    body=payload,
                    error=f"HTTP {response.status} from {url}: {_preview(payload)}",
                    retry_after=_retry_after(response.headers),
                )
            jar = {name: morsel.value for name, morsel in response.cookies.items()}
            return Attempt(outcome=Outcome.OK, status=response.status, body=payload, cookies=jar)
    except TimeoutError as exc:  # asyncio.TimeoutError is TimeoutError
        if isinstance(exc, aiohttp.ConnectionTimeoutError):
            return Attempt(outcome=Outcome.CONNECTION, error=f"connect to {url} timed out")
        return Attempt(outcome=Outcome.TIMEOUT, error=f"no complete answer from {url} in time")
    except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, OSError) as exc:
        return Attempt(outcome=Outcome.CONNECTION, error=f"connection to {url} failed: {exc!r}")
    except aiohttp.ClientResponseError as exc:  # malformed status line or headers
        return Attempt(outcome=Outcome.CONNECTION, error=f"bad response from {url}: {exc!r}")


async def post_with_retries(
    session: aiohttp.ClientSession,
    url: str,
    body: bytes,
    *,
    request_timeout: float,
    connect_timeout: float,
    deadline: float | None,
    retry: RetryPolicy,
    rng: random.Random,
    cookies: Mapping[str, str] | None = None,
) -> Attempt:
    """POST with retries on connection errors, 429 and 5xx, never past ``deadline``.

    ``deadline`` is an absolute ``time.monotonic()`` value (None for none); each
    attempt's timeout is the smaller of ``request_timeout`` and the time left.
    """
    attempt = Attempt(outcome=Outcome.TIMEOUT, error="the deadline passed before sending")
    for number in range(1, retry.max_attempts + 1):
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            break
        budget = request_timeout if left is None else min(request_timeout, left)
        timeout = aiohttp.ClientTimeout(total=budget, sock_connect=min(connect_timeout, budget))
        attempt = attrs.evolve(
            await post(session, url, body, timeout=timeout, cookies=cookies), attempts=number
        )
        retryable = attempt.outcome is Outcome.CONNECTION or (
            attempt.outcome is Outcome.HTTP_ERROR and retry.retryable_status(attempt.status)
        )
        if not retryable or number == retry.max_attempts:
            break
        wait = retry.delay(number, rng, attempt.retry_after)
        if deadline is not None and time.monotonic() + wait >= deadline:
            break
        await asyncio.sleep(wait)
    return attempt


async def gather_bounded(awaitables: list[Awaitable[T]]) -> list[T]:
    """``asyncio.gather`` that cancels the rest if one raises."""
    tasks = [asyncio.ensure_future(a) for a in awaitables]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        raise
