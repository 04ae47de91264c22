"""The synchronous HTTP edge: every ``requests`` call of the library goes through here.

- ``send``: one request; ``requests``' exceptions become the SDK's (``TransportError`` for
  a connection that fails, ``DeadlineError`` for no answer in time). This is the only
  place that catches them.
- ``check``: an HTTP error status becomes a ``ServerError`` (with the server's message).
- ``server_message``: the server's own error text, whatever shape its error body has.
- ``owned_session``: the caller's ``requests.Session``, or one of our own that is closed
  when the block ends, so no session the library opens is left open.

(The asynchronous twin of ``send``, for aiohttp, is ``nemogym_sdk._net.aio.post``.)
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Mapping
from typing import Any

import requests

from nemogym_sdk.errors import DeadlineError, ServerError, TransportError

__all__ = ["check", "owned_session", "send", "server_message"]

_MAX_BODY = 2000


@contextlib.contextmanager
def owned_session(given: requests.Session | None = None) -> Iterator[requests.Session]:
    """``given`` as it is (the caller closes it), or a new session closed on exit."""
    if given is not None:
        yield given
        return
    with requests.Session() as session:
        yield session


def send(
    http: requests.Session,
    method: str,
    url: str,
    *,
    timeout: float,
    headers: Mapping[str, str] | None = None,
    body: Mapping[str, Any] | None = None,
    hint: str = "",
) -> requests.Response:
    """Send one request and return the answer, whatever its status.

    Raises ``TransportError`` when the connection fails and ``DeadlineError`` when no
    answer arrives within ``timeout`` seconds; ``hint`` is appended to either message.
    """
    extra = f" {hint}" if hint else ""
    try:
        return http.request(method, url, json=body, timeout=timeout, headers=dict(headers or {}))
    except requests.ConnectionError as exc:  # includes ConnectTimeout
        raise TransportError(f"cannot reach {url}: {exc}.{extra}") from exc
    except requests.Timeout as exc:
        raise DeadlineError(f"{method} {url} got no answer within {timeout:g} s.{extra}") from exc
    except requests.RequestException as exc:
        raise TransportError(f"{method} {url} failed: {exc}.{extra}") from exc


def check(response: requests.Response, what: str) -> requests.Response:
    """``response`` when its status is below 400; otherwise a ``ServerError`` naming ``what``."""
    if response.status_code < 400:
        return response
    raise ServerError(
        f"{what} answered HTTP {response.status_code}: {server_message(response)}",
        response.status_code,
        response.text[:_MAX_BODY],
    )


def server_message(response: requests.Response) -> str:
    """The server's own error message: vLLM's ``{"error": {"message"}}``, older vLLM's
    ``{"message"}``, FastAPI's ``{"detail"}``, or the plain text."""
    text = response.text.strip()
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    if isinstance(data, Mapping):
        error = data.get("error")
        if isinstance(error, Mapping) and isinstance(error.get("message"), str):
            return str(error["message"])
        for value in (error, data.get("message"), data.get("detail")):
            if isinstance(value, str) and value:
                return value
        if data.get("detail") is not None:
            return json.dumps(data["detail"])[:_MAX_BODY]
    if isinstance(data, str) and data:
        return data
    return text[:_MAX_BODY] or f"HTTP {response.status_code} {response.reason or ''}".strip()
