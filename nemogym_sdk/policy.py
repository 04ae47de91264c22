"""Timeouts, retry policy and sampling parameters for the network clients, and the names of
the version policies a sampler answers by (pure, no I/O)."""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any, Literal

import attrs

from nemogym_sdk.errors import ConfigError
from nemogym_sdk.wire import sampling_overrides

__all__ = ["VERSION_POLICIES", "RetryPolicy", "SamplingParams", "Timeouts", "VersionPolicy"]

VersionPolicy = Literal["pinned", "in_flight"]
"""Which adapter version answers a later turn of an episode that spans a sync: ``pinned``
(the one the episode started on) or ``in_flight`` (the newest); see
``nemogym_sdk.serve.versions``."""
VERSION_POLICIES: tuple[VersionPolicy, ...] = ("pinned", "in_flight")


def _positive(instance: object, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value is not None and not value > 0:
        raise ConfigError(f"{attribute.name} must be > 0 seconds, got {value!r}")


_TRY_LATER = frozenset({429, 502, 503, 504})
"""Statuses that mean "try again later": retried even when they repeat."""


@attrs.frozen(kw_only=True)
class Timeouts:
    """Separate deadlines, in seconds, for one request and for a whole batch.

    ``/run`` plays a whole episode and may take minutes; ``/verify`` is short; a
    connection that cannot be opened in ``connect`` seconds is a connection error (and
    retried). ``total`` bounds a whole ``run``/``verify`` call: rollouts still pending
    when it passes come back as ``TIMEOUT`` failures.
    """

    connect: float = attrs.field(default=10.0, validator=_positive)
    """Opening a TCP connection."""
    request: float = attrs.field(default=1800.0, validator=_positive)
    """One request from send to the end of the body (one attempt)."""
    total: float | None = attrs.field(default=None, validator=_positive)
    """A whole batch, retries included; None for no batch deadline."""


@attrs.frozen(kw_only=True)
class RetryPolicy:
    """Capped exponential backoff with full jitter, on connection errors, 429 and 5xx only
    (and, when ``retry_timeouts`` opts in, on attempts that hit the per-request deadline).

    The delay before retry ``n`` (1-based) is uniform in ``[0, min(max_delay, base_delay *
    2**(n-1))]``; a ``Retry-After`` header, when present, sets a floor (still capped).

    Why a stalled request is final by default: an attempt that timed out on our side may
    still be running on the server. A ``/run`` keeps playing its episode (sampling from
    the policy model, calling tools, holding environment state) after we stop waiting,
    so retrying it doubles the load on an already slow deployment, and an environment
    with side effects may apply them twice. Opt in when episodes are idempotent and a
    stall is more likely a lost connection than an overloaded server. A retry never
    outlives the batch deadline (``Timeouts.total``).

    Why a repeated 500 is final by default: a server's own failure (500, 501, 505 and the
    other 5xx that do not mean "try later") that comes back with exactly the same status
    and body on the replay is the episode's failure, not the network's: NeMo Gym's agent
    raises the same exception for the same row every time, and two more replays would
    only cost two more episodes. 429, 502, 503 and 504 say "try again later" by
    definition and are retried up to ``max_attempts`` whatever their body.
    """

    max_attempts: int = 4
    """Attempts per request, the first included (1 disables retries)."""
    base_delay: float = 0.25
    """Backoff scale in seconds."""
    max_delay: float = 10.0
    """Cap on one backoff delay in seconds."""
    retry_timeouts: bool = False
    """Also retry an attempt that got no complete answer within ``Timeouts.request``
    (off by default: see above)."""
    retry_repeated_errors: bool = False
    """Also retry a server error whose answer repeats the previous attempt's exactly
    (off by default: see above)."""

    def __attrs_post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ConfigError(f"max_attempts must be >= 1, got {self.max_attempts}")
        if self.base_delay < 0 or self.max_delay < 0:
            raise ConfigError(
                f"retry delays must be >= 0, got base_delay={self.base_delay}, "
                f"max_delay={self.max_delay}"
            )

    def retryable_timeout(self) -> bool:
        """Whether an attempt that hit the per-request deadline is retried."""
        return self.retry_timeouts

    @staticmethod
    def retryable_status(status: int) -> bool:
        """Whether an HTTP status is worth retrying (429 and 5xx)."""
        return status == 429 or 500 <= status <= 599

    def final_on_repeat(self, status: int) -> bool:
        """Whether an HTTP error that repeats the previous attempt's answer exactly ends
        the retries (a server's own failure; never 429, 502, 503 or 504)."""
        return not self.retry_repeated_errors and status not in _TRY_LATER

    def delay(self, retry: int, rng: random.Random, retry_after: float | None = None) -> float:
        """Seconds to wait before retry number ``retry`` (1-based)."""
        ceiling = min(self.max_delay, self.base_delay * 2 ** (retry - 1))
        wait = rng.uniform(0.0, ceiling)
        if retry_after is not None and retry_after > 0:
            wait = max(wait, min(retry_after, self.max_delay))
        return wait


@attrs.frozen(kw_only=True)
class SamplingParams:
    """Sampling parameters the trainer sets for every rollout.

    Precedence inside each row's ``responses_create_params``: a value set here wins over
    the row's own value (the learner's logprob correction must match how the sampler
    sampled); a value left as None keeps the row's value; and a None in the row is
    dropped, never sent as a value.
    """

    temperature: float | None = None
    """Sampling temperature."""
    top_p: float | None = None
    """Nucleus sampling mass."""
    max_output_tokens: int | None = None
    """Cap on tokens per model call (NeMo Gym's name for ``max_tokens``)."""

    def overrides(self) -> Mapping[str, float | int | None]:
        """The values as ``responses_create_params`` keys (None means "keep the row's")."""
        return sampling_overrides(self.temperature, self.top_p, self.max_output_tokens)
