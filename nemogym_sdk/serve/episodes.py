"""Episodes the client gave up on: their generations stop, and their later turns are refused.

NeMo Gym's agent plays an episode to its end even after the trainer stopped waiting for it
(its deadline passed, a straggler cut, the run stopping): the agent only sees "client
disconnected" when it answers. So the client tells the sampler instead
(``POST /abort_episode?episode_id=<id>``, ``AgentClient(sampler_url=...)``), the id coming
with every turn of the episode (``nemogym_sdk.wire.EPISODE_ID``). ``Episodes`` keeps, for
the server:

- the generations in flight per episode, each with a way to stop it: the proxy cancels its
  request to vLLM (vLLM aborts a request whose client went away), the CPU server flags the
  job, which its batch drops at the next token;
- the episodes abandoned (the newest ``remember``), whose later turns are refused with
  ``EpisodeAbandonedError`` (HTTP 409) at once, before any token is generated.

Every turn of an episode carries the episode's sampling seed, when the client sends one
(``RolloutRequest.seed``); ``turn_seed`` mixes it with the turn's prompt length, so that the
turns draw apart and a replayed episode draws the same tokens again.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import threading
from collections.abc import Awaitable, Callable, Iterator
from typing import TypeVar

from nemogym_sdk.data import mixed_seed
from nemogym_sdk.serve.errors import ServeError

__all__ = ["EpisodeAbandonedError", "Episodes", "turn_seed"]

T = TypeVar("T")


def turn_seed(seed: int | None, episode: str | None, prompt_length: int) -> int | None:
    """The seed a turn samples with: a request's ``seed`` as sent, except that of a turn of
    an episode (every turn of which carries the episode's seed), mixed with the turn's
    prompt length. A prompt grows from turn to turn, so an episode's turns draw from
    streams of their own (one stream for all would tie each turn's draws to the last
    turn's), and a turn played again with the same prompt draws the same tokens."""
    if seed is None or episode is None:
        return seed
    return mixed_seed(seed, prompt_length)


class EpisodeAbandonedError(ServeError):
    """The client gave up on the episode this turn belongs to (HTTP 409): it is not
    generated, and one in flight was stopped."""

    status = 409
    err_type = "EpisodeAbandonedError"


class Episodes:
    """The abandoned episodes and the generations in flight (thread-safe: the CPU server
    generates on worker threads, the proxy on the event loop)."""

    def __init__(self, remember: int = 100_000) -> None:
        self.remember = remember
        self._lock = threading.Lock()
        self._abandoned: collections.OrderedDict[str, None] = collections.OrderedDict()
        self._running: dict[str, list[tuple[threading.Event, Callable[[], None] | None]]] = {}
        self.aborted_generations = 0
        """Generations stopped in flight since the server started."""
        self.refused_turns = 0
        """Turns of abandoned episodes refused before generating."""

    def check(self, episode: str | None) -> None:
        """Raise ``EpisodeAbandonedError`` when ``episode`` was abandoned."""
        if episode is None:
            return
        with self._lock:
            abandoned = episode in self._abandoned
            if abandoned:
                self.refused_turns += 1
        if abandoned:
            raise _abandoned(episode)

    @contextlib.contextmanager
    def running(
        self, episode: str | None, stop: Callable[[], None] | None = None
    ) -> Iterator[threading.Event]:
        """While a generation of ``episode`` runs: an event set when the episode is abandoned
        (``stop`` is called then too). Raises ``EpisodeAbandonedError`` on entry for an
        episode already abandoned."""
        aborted = threading.Event()
        if episode is None:
            yield aborted
            return
        self.check(episode)
        entry = (aborted, stop)
        with self._lock:
            self._running.setdefault(episode, []).append(entry)
        try:
            yield aborted
        finally:
            with self._lock:
                entries = self._running.get(episode, [])
                if entry in entries:
                    entries.remove(entry)
                if not entries:
                    self._running.pop(episode, None)

    async def generate(self, episode: str | None, start: Callable[[], Awaitable[T]]) -> T:
        """Await ``start()`` (a request to vLLM) as a task that abandoning ``episode``
        cancels: the request is closed, so vLLM aborts it, and ``EpisodeAbandonedError``
        is raised here. Nothing starts for an episode already abandoned."""
        loop = asyncio.get_running_loop()
        tasks: list[asyncio.Future[T]] = []

        def stop() -> None:
            for task in tasks:
                loop.call_soon_threadsafe(task.cancel)

        with self.running(episode, stop) as aborted:
            tasks.append(asyncio.ensure_future(start()))  # before any await: stop sees it
            try:
                return await tasks[0]
            except asyncio.CancelledError:
                current = asyncio.current_task()
                if not aborted.is_set() or (current is not None and current.cancelling()):
                    raise  # cancelled from outside, not by the episode's abandonment
                raise self.stopped(episode) from None

    def abandon(self, episode: str) -> int:
        """Mark ``episode`` abandoned and stop its generations in flight; how many."""
        with self._lock:
            self._abandoned[episode] = None
            self._abandoned.move_to_end(episode)
            while len(self._abandoned) > self.remember:
                self._abandoned.popitem(last=False)
            entries = self._running.pop(episode, [])
            self.aborted_generations += len(entries)
        for aborted, stop in entries:
            aborted.set()
            if stop is not None:
                stop()
        return len(entries)

    def stopped(self, episode: str | None) -> EpisodeAbandonedError:
        """The error a generation stopped for ``episode`` ends with."""
        return _abandoned(episode or "?")


def _abandoned(episode: str) -> EpisodeAbandonedError:
    return EpisodeAbandonedError(
        f"Episode {episode!r} was abandoned by the client (its deadline passed or it was "
        "cut); its turns are no longer generated."
    )
