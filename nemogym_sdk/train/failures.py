"""A step's failed rollouts: recorded in ``failures.jsonl``, counted, and checked against
``max_failure_rate`` before the step learns.

- ``failure_lines``: a line per failed rollout of a step: its step, row, status and reason
  (an episode that ``cut_stragglers`` ended included: its reason says so);
- ``record_failures``: every rank's lines, appended to ``out/failures.jsonl`` (a resumed run
  drops the lines of the steps it repeats, as ``metrics.jsonl``'s);
- ``failed_rollouts``: a rank's failures by status, the episodes cut as stragglers left out;
- ``check_step``: all of it for one step, then ``check_rollouts``, on the main rank; when
  episodes timed out, the servers that do not answer then are named (``silent_servers``).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from nemogym_sdk import ranks
from nemogym_sdk.directory import ServerDirectory
from nemogym_sdk.records import Rollout
from nemogym_sdk.train.checkpoints import latest
from nemogym_sdk.train.faults import FAILURES_FILE, check_rollouts, writing
from nemogym_sdk.train.play import Played

__all__ = [
    "FAILURES_FILE",
    "check_step",
    "failed_rollouts",
    "failure_lines",
    "record_failures",
    "silent_servers",
]


def failure_lines(step: int, rollouts: Sequence[Rollout]) -> list[dict[str, Any]]:
    """A line of ``failures.jsonl`` per failed rollout of ``step`` (an episode that
    ``cut_stragglers`` ended included: its reason says so)."""
    return [
        {"step": step, "row_id": r.row_id, "status": r.status.value, "reason": r.error}
        for r in rollouts
        if not r.ok
    ]


def record_failures(out: Path, lines: Sequence[Mapping[str, Any]]) -> None:
    """Append ``lines`` (``failure_lines``, every rank's) to ``out/failures.jsonl``."""
    if lines:
        with (out / FAILURES_FILE).open("a") as handle:
            handle.write("".join(json.dumps(line) + "\n" for line in lines))


def check_step(
    step: int,
    played: Played,
    out: Path,
    max_rate: float,
    sampler: str | None,
    deployments: Sequence[ServerDirectory] = (),
) -> None:
    """Every rank's failed rollouts of ``step`` as lines of ``failures.jsonl``, then the step
    checked against ``max_rate`` and the sampler (``check_rollouts``), on the main rank.

    When episodes timed out or lost their connection, the ``deployments``' servers that do
    not answer then (frozen or dead) are named in those lines' reasons and in the message:
    a timeout at the agent says nothing of which server behind it stalled."""
    counted = ranks.gather(
        (failed_rollouts(played), len(played.rollouts), failure_lines(step, played.rollouts))
    )
    failures = sum((c for c, _, _ in counted), Counter[str]())
    rollouts = sum(n for _, n, _ in counted)
    lines = [line for _, _, rank_lines in counted for line in rank_lines]

    def on_main() -> None:
        note = silent_servers(deployments) if _stalled(lines) else ""
        for line in lines:
            if note and line["status"] in _STALLED:
                line["reason"] = f"{line['reason']}; {note}"
        with writing(f"{out / FAILURES_FILE}", latest(out)):
            record_failures(out, lines)
        check_rollouts(step, failures, rollouts, max_rate, sampler, out=out, note=note)

    ranks.on_main(on_main)


_STALLED = frozenset({"timeout", "transport_error"})
"""Failures that a server behind the agent may have caused by freezing or dying."""


def _stalled(lines: Sequence[Mapping[str, Any]]) -> bool:
    return any(line["status"] in _STALLED for line in lines)


def silent_servers(deployments: Sequence[ServerDirectory], timeout: float = 2.0) -> str:
    """The deployments' servers that do not answer within ``timeout`` seconds, in words
    (empty when all answer)."""
    silent = {n: why for d in deployments for n, why in d.unresponsive(timeout=timeout).items()}
    if not silent:
        return ""
    named = "; ".join(f"{name} ({why})" for name, why in silent.items())
    return f"not answering at the step's end: {named}"


def failed_rollouts(played: Played) -> Counter[str]:
    """This rank's failed rollouts of a step, by status (episodes ``cut_stragglers`` ended
    are not failures of the environment)."""
    counts = Counter(r.status.value for r in played.rollouts if not r.ok)
    cut = int(played.metrics.get("engine_cut_episodes", 0))
    if cut:
        counts["timeout"] = max(0, counts["timeout"] - cut)
    return +counts
