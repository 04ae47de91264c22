"""The one readiness poller: ``ServerDirectory`` (its head server and ``wait_until_ready``),
``gym`` (local servers and backends) and the vLLM proxy's start all wait through it.

``poll_ready`` asks ``GET`` of each URL, round after round, until every one answers
as wanted or the time is up, and returns what is still pending and why. Callers turn
that into their own error (``NotReadyError``, ``ServerNotReadyError``); a caller that
can tell a dead server from a slow one (a local process that exited) does so in
``before_probe``, which may raise.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

import requests

from nemogym_sdk._net.http import send
from nemogym_sdk.errors import DeadlineError, TransportError

__all__ = ["answered", "poll_ready", "status_2xx"]

PROBE_TIMEOUT_S = 2.0
"""The most one probe waits for an answer."""


def status_2xx(status: int) -> bool:
    """Ready means a 2xx answer (NeMo Gym servers answer ``GET /`` with 200)."""
    return 200 <= status < 300


def answered(status: int) -> bool:
    """Ready means any HTTP answer at all (NeMo Gym's own model-endpoint check)."""
    return True


def poll_ready(
    urls: Mapping[str, str],
    *,
    timeout: float,
    session: requests.Session,
    interval: float = 0.25,
    ready: Callable[[int], bool] = status_2xx,
    before_probe: Callable[[str], None] | None = None,
    probe_timeout: float | None = None,
) -> dict[str, str]:
    """Poll ``GET url`` for every ``name -> url`` until all are ready or ``timeout`` passes.

    Args:
        urls: name -> the URL to probe.
        timeout: seconds to keep trying; every URL is probed at least once.
        session: the HTTP session to probe with.
        interval: seconds between rounds.
        ready: which HTTP status counts as ready.
        before_probe: called with a name before each of its probes; may raise to stop
            polling (e.g. when the local process behind it has exited).
        probe_timeout: the most one probe waits (default: ``PROBE_TIMEOUT_S``, or
            ``timeout`` when that is shorter).

    Returns:
        name -> why it is not ready, in ``urls`` order, for those still pending (empty
        when every URL is ready).
    """
    deadline = time.monotonic() + timeout
    pending = {name: "not checked yet" for name in urls}
    if probe_timeout is None:
        probe_timeout = min(PROBE_TIMEOUT_S, timeout) if timeout > 0 else PROBE_TIMEOUT_S
    while True:
        for name in list(pending):
            if before_probe is not None:
                before_probe(name)
            url = urls[name]
            try:
                response = send(session, "GET", url, timeout=probe_timeout)
            except (TransportError, DeadlineError) as exc:
                cause = exc.__cause__ if exc.__cause__ is not None else exc
                pending[name] = f"{url}: {type(cause).__name__}"
                continue
            if ready(response.status_code):
                del pending[name]
            else:
                pending[name] = f"{url}: HTTP {response.status_code}"
        if not pending or time.monotonic() >= deadline:
            return pending
        time.sleep(interval)
