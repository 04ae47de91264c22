"""Shared asyncio plumbing for the network clients.

- ``BackgroundLoop``: one event loop on one daemon thread, owned by a client, so the
  synchronous facades reuse one loop and one ``aiohttp.ClientSession`` instead of
  creating a loop per call.
- ``post``: one HTTP attempt with the foreign-exception edge: every aiohttp and
  asyncio error is translated here into an ``Attempt`` outcome, nowhere else.
- ``post_with_retries``: the retry loop (capped exponential backoff with jitter on
  connection errors, 429 and 5xx; on per-request timeouts only when the policy opts
  in), bounded by an absolute deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import email.utils
import enum
import functools
import random
import threading
import time
import types
from collections.abc import Coroutine, Mapping
from concurrent.futures import Future
from typing import Any, NamedTuple, TypeVar

import aiohttp

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
        future = self.submit(coroutine)
        try:
            return future.result()
        except BaseException:  # KeyboardInterrupt, a stop signal: the work is abandoned
            future.cancel()
            raise

    def close(self) -> None:
        """Cancel what still runs on the loop (and let it unwind), stop the loop and join
        its thread (idempotent)."""
        if self._loop.is_closed():
            return
        if self._thread.is_alive():
            with contextlib.suppress(TimeoutError, RuntimeError):
                self.submit(_cancel_all()).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()


async def _cancel_all() -> None:
    """Cancel every other task on the running loop and wait until each has unwound (so none
    is destroyed while pending when the loop closes)."""
    tasks = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


_NO_COOKIES: Mapping[str, str] = types.MappingProxyType({})


class Outcome(enum.Enum):
    """How one HTTP exchange ended."""

    OK = "ok"
    HTTP_ERROR = "http_error"
    CONNECTION = "connection"
    TIMEOUT = "timeout"
    PROTOCOL = "protocol"
    """The exchange broke HTTP's rules (e.g. a redirect to a non-HTTP URL): not retried."""


class Attempt(NamedTuple):
    """The result of one request, after retries (a tuple: one per request, hot path)."""

    outcome: Outcome
    status: int = 0
    """HTTP status (0 when no response arrived)."""
    body: bytes = b""
    """The full body for OK and HTTP errors."""
    cookies: Mapping[str, str] = _NO_COOKIES
    """Cookies the server set (read only when asked for, for a per-rollout jar)."""
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
    """``Retry-After`` as seconds: delta-seconds or an HTTP date."""
    value = headers.get("Retry-After")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.UTC)
    return max(0.0, (when - datetime.datetime.now(datetime.UTC)).total_seconds())


def _preview(body: bytes) -> str:
    text = body[:_BODY_PREVIEW].decode("utf-8", "replace")
    return text + ("..." if len(body) > _BODY_PREVIEW else "")


_JSON_HEADERS = {"Content-Type": "application/json"}


async def post(
    session: aiohttp.ClientSession,
    url: str,
    body: bytes,
    *,
    timeout: aiohttp.ClientTimeout,
    number: int = 1,
    cookies: Mapping[str, str] | None = None,
    want_cookies: bool = False,
) -> Attempt:
    """Attempt ``number`` of a POST of a JSON body; never raises for network or HTTP problems.

    This is the one edge where aiohttp's exceptions become ``Attempt`` outcomes.
    """
    try:
        async with session.post(
            url, data=body, headers=_JSON_HEADERS, timeout=timeout, cookies=cookies
        ) as response:
            payload = await response.read()
            if response.status >= 400:
                return Attempt(
                    outcome=Outcome.HTTP_ERROR,
                    status=response.status,
                    body=payload,
                    error=f"HTTP {response.status} from {url}: {_preview(payload)}",
                    attempts=number,
                    retry_after=_retry_after(response.headers),
                )
            jar = (
                {name: morsel.value for name, morsel in response.cookies.items()}
                if want_cookies
                else _NO_COOKIES
            )
            return Attempt(
                outcome=Outcome.OK,
                status=response.status,
                body=payload,
                cookies=jar,
                attempts=number,
            )
    except TimeoutError as exc:  # asyncio.TimeoutError is TimeoutError
        if isinstance(exc, aiohttp.ConnectionTimeoutError):
            error = f"connect to {url} timed out"
            return Attempt(outcome=Outcome.CONNECTION, error=error, attempts=number)
        error = f"no complete answer from {url} in time"
        return Attempt(outcome=Outcome.TIMEOUT, error=error, attempts=number)
    except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, OSError) as exc:
        error = f"connection to {url} failed: {exc!r}"
        return Attempt(outcome=Outcome.CONNECTION, error=error, attempts=number)
    except aiohttp.ClientResponseError as exc:  # malformed status line or headers
        error = f"bad response from {url}: {exc!r}"
        return Attempt(outcome=Outcome.CONNECTION, error=error, attempts=number)
    except (aiohttp.ClientError, ValueError) as exc:  # bad redirects, invalid URLs ...
        error = f"request to {url} failed: {exc!r}"
        return Attempt(outcome=Outcome.PROTOCOL, error=error, attempts=number)


@functools.lru_cache(maxsize=32)
def _timeout(total: float, connect: float) -> aiohttp.ClientTimeout:
    return aiohttp.ClientTimeout(total=total, sock_connect=connect)


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
    want_cookies: bool = False,
) -> Attempt:
    """POST with retries on connection errors, 429 and 5xx (and timeouts, when
    ``retry.retry_timeouts``), never past ``deadline``.

    ``deadline`` is an absolute ``time.monotonic()`` value (None for none); each
    attempt's timeout is the smaller of ``request_timeout`` and the time left.
    """
    attempt = Attempt(
        outcome=Outcome.TIMEOUT, attempts=0, error="the deadline passed before sending"
    )
    failed: Attempt | None = None  # the last failed attempt before ``attempt``
    for number in range(1, retry.max_attempts + 1):
        if deadline is None:
            timeout = _timeout(request_timeout, connect_timeout)
        else:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            budget = min(request_timeout, left)
            timeout = aiohttp.ClientTimeout(total=budget, sock_connect=min(connect_timeout, budget))
        if number > 1:
            failed = attempt
        attempt = await post(
            session,
            url,
            body,
            timeout=timeout,
            number=number,
            cookies=cookies,
            want_cookies=want_cookies,
        )
        if not _retryable(attempt, failed, retry) or number == retry.max_attempts:
            break
        wait = retry.delay(number, rng, attempt.retry_after)
        if deadline is not None and time.monotonic() + wait >= deadline:
            break
        await asyncio.sleep(wait)
    return _with_earlier_cause(attempt, failed)


def _retryable(attempt: Attempt, failed: Attempt | None, retry: RetryPolicy) -> bool:
    """Whether ``attempt`` is worth another: connection errors, 429 and 5xx (and timeouts
    when the policy opts in), except a server error that repeats ``failed`` exactly."""
    if attempt.outcome is Outcome.CONNECTION:
        return True
    if attempt.outcome is Outcome.TIMEOUT:
        return retry.retryable_timeout()
    if attempt.outcome is not Outcome.HTTP_ERROR or not retry.retryable_status(attempt.status):
        return False
    repeated = (
        failed is not None
        and failed.outcome is Outcome.HTTP_ERROR
        and (failed.status, failed.body) == (attempt.status, attempt.body)
    )
    return not (repeated and retry.final_on_repeat(attempt.status))


def _with_earlier_cause(attempt: Attempt, failed: Attempt | None) -> Attempt:
    """A last attempt that timed out (the deadline cut it short) keeps the cause of the
    failure before it: a persistent 500 whose retries outlast the deadline still says 500."""
    if attempt.outcome is not Outcome.TIMEOUT or failed is None or failed.error is None:
        return attempt
    return attempt._replace(error=f"{attempt.error}; the attempt before: {failed.error}")
