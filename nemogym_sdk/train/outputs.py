"""The reference trainer's outputs: ``metrics.jsonl``, the summary and the reward curve
(checkpoints: ``nemogym_sdk.train.checkpoints``).

- ``outputs``: per step, a line of ``metrics.jsonl`` (rank 0), the trackers of
  ``--report-to`` (``nemogym_sdk.train.trackers``) and the progress bar;
- ``finish``: ``summary.json`` and ``reward_curve.png``, and where everything is;
- ``say``: one line on stderr for a phase that takes a while (starting servers, waiting for
  one), so a user never waits in silence;
- ``library_warnings``: the SDK's own warnings (a server slow to stop, say) on stderr in the
  same voice, ``nemogym-train: ...``, unless the user configured logging.

Imports tqdm and matplotlib inside the functions that need them.
"""

from __future__ import annotations

import contextlib
import json
import logging
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeAlias

from nemogym_sdk.train.checkpoints import latest
from nemogym_sdk.train.config import TrainConfig
from nemogym_sdk.train.faults import FAILURES_FILE
from nemogym_sdk.train.trackers import Trackers

__all__ = [
    "MetricsLog",
    "finish",
    "library_warnings",
    "open_metrics",
    "outputs",
    "plot_curve",
    "postfix",
    "progress",
    "say",
]


MetricsLog: TypeAlias = Callable[[dict[str, Any]], None]
"""``log(line)``: one step's metrics to ``metrics.jsonl``, the trackers and the progress bar."""


def say(message: str) -> None:
    """``nemogym-train: message`` on stderr, now (a phase that takes more than a moment)."""
    print(f"nemogym-train: {message}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def library_warnings() -> Iterator[None]:
    """While open, warnings of the ``nemogym_sdk`` loggers go to stderr as
    ``nemogym-train: message``; without it Python's last-resort handler prints them bare, and
    a user cannot tell who spoke. A program that configured logging (the root logger has a
    handler) keeps its own handling."""
    if logging.getLogger().handlers:
        yield
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setLevel(logging.WARNING)
    handler.setFormatter(logging.Formatter("nemogym-train: %(message)s"))
    library = logging.getLogger("nemogym_sdk")
    library.addHandler(handler)
    try:
        yield
    finally:
        library.removeHandler(handler)


@contextlib.contextmanager
def outputs(config: TrainConfig, out: Path, start: int, rank: int) -> Iterator[MetricsLog]:
    """``log(line)``: a line of ``metrics.jsonl`` (rank 0), the same numbers to the trackers
    of ``report_to`` (rank 0; ``nemogym_sdk.train.trackers``) and the progress bar. After
    the last step the trackers get the reward curve too.

    Raises:
        ConfigError: a tracker could not start (before any step).
    """
    trackers = Trackers.start(config.report_to, config, out) if rank == 0 else None
    bar = progress(config, start, rank)
    metrics_file = open_metrics(out / "metrics.jsonl", start) if rank == 0 else None
    if rank == 0:  # failures.jsonl keeps the steps before ``start`` too
        open_metrics(out / FAILURES_FILE, start).close()

    def log(line: dict[str, Any]) -> None:
        if metrics_file is not None:
            metrics_file.write(json.dumps(line) + "\n")
            metrics_file.flush()
        if trackers is not None:
            trackers.log(line)  # after metrics.jsonl: a failing tracker loses nothing there
        bar.update(1)
        bar.set_postfix(postfix(line))

    failed = True
    try:
        yield log
        failed = False
    finally:
        bar.close()
        if metrics_file is not None:
            metrics_file.close()
        if trackers is not None:
            try:
                if not failed and trackers.started:
                    _curve_to_trackers(trackers, config, out)
            finally:
                trackers.close(failed)


def _curve_to_trackers(trackers: Trackers, config: TrainConfig, out: Path) -> None:
    """The whole run's reward curve (``metrics.jsonl``, resumed steps included) as
    ``reward_curve.png``, at the last step, to every tracker."""
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    if lines:
        path = out / "reward_curve.png"
        plot_curve([line["reward_mean"] for line in lines], path, title=_title(config))
        trackers.log_image(int(lines[-1]["step"]), "reward_curve", path)


def progress(config: TrainConfig, start: int, rank: int) -> Any:
    """The progress bar (rank 0): steps done and tqdm's ETA; ``postfix`` adds each step's
    numbers."""
    from tqdm import tqdm  # type: ignore[import-untyped]

    return tqdm(
        total=config.steps, initial=start, desc="nemogym-train", unit="step", disable=rank != 0
    )


def postfix(line: Mapping[str, Any]) -> dict[str, str]:
    """A step's numbers on the progress bar: ``reward`` (mean of the ``OK`` rollouts),
    ``fail`` (failed episodes), ``stale`` (adapter versions the trained tokens were behind
    the learner: mean/max)."""
    return {
        "reward": f"{line['reward_mean']:.3f}",
        "fail": str(sum(line["failures"].values())),
        "stale": f"{line.get('staleness_mean', 0.0):.2f}/{line.get('staleness_max', 0)}",
    }


def open_metrics(path: Path, start: int) -> Any:
    """``metrics.jsonl`` (or ``failures.jsonl``) for appending, without lines of steps from
    ``start`` on (a resumed run repeats the steps after its checkpoint; a run from step 0
    keeps none, such as one killed before its first checkpoint and started again) and
    without a line cut short by a kill; rewritten aside, then renamed."""
    if path.exists():
        kept = [line for line in path.read_text().splitlines() if _step_of(line) < start]
        aside = path.with_name(f".{path.name}.tmp")
        aside.write_text("".join(line + "\n" for line in kept))
        aside.replace(path)
    return path.open("a")


def _step_of(line: str) -> float:
    """The step of a ``metrics.jsonl`` line; infinity for a line that does not parse (cut
    short when the run was killed mid-write), so it is dropped."""
    try:
        step = json.loads(line)["step"]
    except (ValueError, KeyError, TypeError):
        return float("inf")
    return float(step)


def finish(
    config: TrainConfig,
    out: Path,
    curve: list[float],
    rank: int,
    leftover: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """``summary.json`` and ``reward_curve.png`` (rank 0); print where everything is.

    ``leftover`` is what the rollout side left untrained at the end (async mode)."""
    head, tail = curve[: min(5, len(curve))], curve[-min(5, len(curve)) :]
    summary: dict[str, Any] = {
        "steps": len(curve),
        "mode": config.mode,
        "curve": curve,
        "first5": sum(head) / len(head) if head else None,
        "last5": sum(tail) / len(tail) if tail else None,
    }
    if leftover:
        summary["leftover"] = dict(leftover)
    if rank == 0:  # rank 0 wrote the checkpoints; the other ranks may be ahead of it here
        summary["metrics"] = str(out / "metrics.jsonl")
        newest = latest(out)
        summary["checkpoint"] = str(newest) if newest is not None else None
        summary["reward_curve"] = str(out / "reward_curve.png")
        plot_curve(curve, out / "reward_curve.png", title=_title(config))
        (out / "summary.json").write_text(json.dumps(summary, indent=1))
        print(
            f"\nreward {summary['first5']:.3f} (first 5 steps) -> {summary['last5']:.3f} "
            f"(last 5)\nmetrics     {summary['metrics']}\ncheckpoint  {summary['checkpoint']}"
            f"\ncurve       {summary['reward_curve']}",
            flush=True,
        )
    return summary


def _title(config: TrainConfig) -> str:
    return ", ".join(config.environments)


def plot_curve(curve: Sequence[float], path: Path, *, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(6, 3.5), dpi=100)
    axes.plot(range(1, len(curve) + 1), curve, marker="o", markersize=3)
    axes.set(xlabel="step", ylabel="mean reward (OK rollouts)", title=f"nemogym-train: {title}")
    axes.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)
