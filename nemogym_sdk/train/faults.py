"""The reference trainer's answers to faults: stop signals, failed rollouts, a lost sampler,
an output it cannot write.

- ``StopSignals``: SIGINT and SIGTERM (what Ctrl-C, ``timeout``, Slurm and Kubernetes send)
  stop the run cleanly. During the rollouts the step is abandoned at once; while the
  learner learns, syncs and writes, the step is finished first (a second signal abandons
  it). Either way the run unwinds: a checkpoint at the last finished step, every server it
  started stopped, a one-line message, exit status ``128 + signal``.
- ``check_rollouts``: before a step learns, a step whose failed rollouts exceed
  ``max_failure_rate``, or whose sampler no longer answers, stops the run
  (``RunStoppedError``) at that step boundary, with a checkpoint; the message names where
  the reasons are (``where_reasons``: ``failures.jsonl`` and the logs).
- ``SamplerWatch``: the sampler is asked every few seconds whether it still answers; one
  that stopped answering stops the run the way a signal does (NeMo Gym's model server
  retries a sampler that refuses connections without end, so its episodes would only
  end at ``episode_timeout``).
- ``check_out``: the output directory can be created and written, before any server starts.
- ``writing``: an output write that fails (disk full, say) is a ``RunStoppedError`` that
  names the file and the last good checkpoint.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import FrameType
from typing import Any

import requests

from nemogym_sdk.errors import ConfigError, NemoGymError
from nemogym_sdk.lora.versions import unwritable

__all__ = [
    "FAILURES_FILE",
    "Interrupted",
    "RunStoppedError",
    "SamplerWatch",
    "StopSignals",
    "check_out",
    "check_rollouts",
    "where_reasons",
    "writing",
]

FAILURES_FILE = "failures.jsonl"
"""In ``out``: a line per failed rollout, ``{"step", "row_id", "status", "reason"}``
(``nemogym_sdk.train.failures`` writes it; the stop messages here name it)."""

_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_STOP = signal.SIGUSR1
"""Sent to the main thread by ``StopSignals.stop`` (another thread found a reason to stop)."""


class Interrupted(KeyboardInterrupt):
    """A stop signal arrived (SIGINT or SIGTERM); like ``KeyboardInterrupt``, no ``except
    Exception`` on the way up swallows it."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def exit_status(self) -> int:
        """``128 + signal number``: the status a shell reports for a process stopped by it."""
        return 128 + self.signum


class RunStoppedError(NemoGymError, RuntimeError):
    """The reference trainer stopped the run on purpose: failed rollouts past
    ``max_failure_rate``, a sampler that no longer answers, or an output it could not
    write. The message says which, and where the last good checkpoint is."""


class StopSignals:
    """``with StopSignals() as signals``: SIGINT and SIGTERM raise ``Interrupted`` in the
    main thread, except inside ``with signals.deferred()``, which finishes first (a second
    signal there raises at once); ``stop(error)``, from any thread, raises ``error`` in the
    main thread the same way. The previous handlers come back on exit. Outside the main
    thread (where Python delivers no signals) it installs nothing."""

    def __init__(self) -> None:
        self.received: int | None = None
        """The first signal received (its number), or None."""
        self._deferring = False
        self._previous: dict[int, Any] = {}
        self._error: Exception | None = None

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for signum in (*_SIGNALS, _STOP):
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def stop(self, error: Exception) -> None:
        """Raise ``error`` in the main thread (at once, or when the step being learned is
        done); callable from any thread. Without installed handlers it only records it."""
        if self._error is not None or self.received is not None:
            return
        self._error = error
        if self._previous:  # wakes a main thread blocked on a lock, like a signal does
            signal.pthread_kill(threading.main_thread().ident or 0, _STOP)

    def __exit__(self, *exc_info: object) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if signum == _STOP:
            if not self._deferring and self._error is not None:
                raise self._error
            return
        first = self.received is None
        self.received = signum if first else self.received
        if self._deferring and first:
            name = signal.Signals(signum).name
            print(
                f"nemogym-train: {name}: finishing the current step, then stopping "
                "(send it again to stop now)",
                file=sys.stderr,
                flush=True,
            )
            return
        raise Interrupted(signum)

    @contextlib.contextmanager
    def deferred(self) -> Iterator[None]:
        """A first signal inside waits for the block to finish, then raises ``Interrupted``
        (a signal received before the block raises on entry)."""
        self._raise_pending()
        self._deferring = True
        try:
            yield
        finally:
            self._deferring = False
        self._raise_pending()

    def _raise_pending(self) -> None:
        if self.received is not None:
            raise Interrupted(self.received)
        if self._error is not None:
            raise self._error


def check_rollouts(
    step: int,
    failures: Mapping[str, int],
    rollouts: int,
    max_rate: float,
    sampler: str | None,
    *,
    out: Path | None = None,
    note: str = "",
) -> None:
    """Stop the run before ``step`` learns when its failed rollouts (``failures``: count by
    status, over every rank) exceed ``max_rate`` of ``rollouts``, or when some failed and
    the ``sampler`` (its OpenAI base URL; None: not checked) no longer answers. The message
    names where the reasons are: ``out``'s ``failures.jsonl`` and the servers' logs, after
    ``note`` (the servers found not answering, say)."""
    failed = sum(failures.values())
    if not failed:
        return
    counts = ", ".join(f"{status}: {count}" for status, count in sorted(failures.items()))
    if note:
        counts = f"{counts}; {note}"
    gone = sampler_gone(sampler) if sampler is not None else None
    if gone is not None:
        raise RunStoppedError(
            f"the sampler at {sampler} does not answer ({gone}) and {failed} of {rollouts} "
            f"rollouts of step {step} failed ({counts}); {where_reasons(out)}"
        )
    if failed > max_rate * rollouts:
        raise RunStoppedError(
            f"{failed} of {rollouts} rollouts of step {step} failed ({counts}), more than "
            f"max_failure_rate={max_rate:g}; {where_reasons(out)} (raise max_failure_rate to "
            "go on through them)"
        )


def where_reasons(out: Path | None) -> str:
    """Where a run's failures are explained: its ``failures.jsonl``, the samplers' logs and,
    when the trainer started NeMo Gym, its servers' logs."""
    if out is None:
        return "the reasons are in the rollouts' errors and the servers' logs"
    gym = out / "gym" / "logs"
    gym_logs = (
        f", NeMo Gym's in {gym}/"
        if gym.is_dir()
        else ", NeMo Gym's where its deployment keeps them (the trainer did not start it)"
    )
    return (
        f"each failed rollout's reason is in {out / FAILURES_FILE}; the samplers' logs are "
        f"in {out / 'logs'}/{gym_logs}"
    )


def sampler_gone(url: str, timeout: float = 10.0) -> str | None:
    """Why the sampler at ``url`` (``.../v1``) does not answer ``GET /models``, or None when
    it does."""
    try:
        response = requests.get(f"{url}/models", timeout=timeout)
    except requests.RequestException as exc:
        return type(exc).__name__
    return None if response.ok else f"HTTP {response.status_code}"


class SamplerWatch:
    """``with SamplerWatch(url, signals)``: a thread asks the sampler at ``url`` (``.../v1``)
    every ``every`` seconds whether it answers; after ``misses`` answers missed in a row, it
    stops the run (``signals.stop(RunStoppedError(...))``)."""

    def __init__(
        self, url: str, signals: StopSignals, *, every: float = 2.0, misses: int = 3
    ) -> None:
        self.url, self.every, self.misses = url, every, misses
        self._signals = signals
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="sampler-watch", daemon=True)

    def __enter__(self) -> SamplerWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._done.set()
        self._thread.join(timeout=30)

    def _watch(self) -> None:
        missed: list[str] = []
        while not self._done.wait(self.every):
            gone = sampler_gone(self.url, timeout=max(self.every, 5.0))
            missed = [*missed, gone] if gone is not None else []
            if len(missed) >= self.misses and not self._done.is_set():
                self._signals.stop(
                    RunStoppedError(
                        f"the sampler at {self.url} does not answer ({missed[-1]}, "
                        f"{len(missed)} times in a row); its log is in the run's logs/"
                    )
                )
                return


def check_out(out: Path) -> None:
    """The output directory exists (created here) and takes a file, else a ``ConfigError``
    before anything starts."""
    problem = unwritable(out)
    if problem is not None:
        raise ConfigError(
            f"out={str(out)!r} cannot be written ({problem}); choose another directory with "
            "--out, or fix its permissions or free space"
        )


@contextlib.contextmanager
def writing(what: str, last_good: Path | None) -> Iterator[None]:
    """A failure inside (disk full, a read-only file system: an ``OSError``, or what
    safetensors and torch raise for one) becomes a ``RunStoppedError`` naming ``what`` was
    being written and the last good checkpoint."""
    try:
        yield
    except RunStoppedError:
        raise
    except Exception as exc:  # writers wrap I/O errors in their own types
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        kept = f"the last good checkpoint is {last_good}" if last_good else "no checkpoint yet"
        raise RunStoppedError(
            f"could not write {what} ({reason}); {kept}; free space or fix the output "
            "directory, then continue with --resume"
        ) from exc
