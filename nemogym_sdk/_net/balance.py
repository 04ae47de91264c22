"""Which deployment plays a rollout, when several run the same agent.

An agent deployed in several NeMo Gym deployments (one per node, say) has one ``/run`` URL in
each. ``Balancer.pick`` sends each rollout to the URL with the fewest rollouts in flight,
skipping URLs that recently refused connections; ``failed`` marks one so for ``cooldown``
seconds. A deployment that went away thus costs a few typed failures, then gets no more
rollouts until the cooldown passes and it is tried again. Pure bookkeeping, on the client's
event loop: no locks, no I/O.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import time
from collections.abc import Iterator, Sequence

__all__ = ["Balancer"]


class Balancer:
    """Least-in-flight choice among an agent's URLs, with a cooldown for failed ones."""

    def __init__(self, cooldown: float = 30.0) -> None:
        self.cooldown = cooldown
        self._inflight: collections.Counter[str] = collections.Counter()
        self._down_until: dict[str, float] = {}
        self._turn = itertools.count()

    def pick(self, urls: Sequence[str], tried: Sequence[str] = ()) -> str:
        """The URL to send to: not tried yet for this rollout, up if any is, and then the
        one with the fewest rollouts in flight (ties in turn)."""
        if len(urls) == 1:
            return urls[0]
        left = [u for u in urls if u not in tried] or list(urls)
        now = time.monotonic()
        up = [u for u in left if self._down_until.get(u, 0.0) <= now] or left
        turn = next(self._turn)
        return min(up, key=lambda u: (self._inflight[u], (urls.index(u) - turn) % len(urls)))

    @contextlib.contextmanager
    def using(self, url: str) -> Iterator[None]:
        """Count a rollout in flight on ``url`` while the block runs."""
        self._inflight[url] += 1
        try:
            yield
        finally:
            self._inflight[url] -= 1

    def failed(self, url: str) -> None:
        """``url`` refused a connection: prefer the others for ``cooldown`` seconds."""
        self._down_until[url] = time.monotonic() + self.cooldown

    def down(self) -> list[str]:
        """The URLs in their cooldown now."""
        now = time.monotonic()
        return sorted(u for u, until in self._down_until.items() if until > now)
