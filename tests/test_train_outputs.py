"""nemogym-train's outputs without servers: resumed metrics."""

from __future__ import annotations

import json
from pathlib import Path

from nemogym_sdk.train.outputs import open_metrics


def test_resumed_metrics_drop_the_steps_after_the_checkpoint(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"step": s}) + "\n" for s in range(6)))
    with open_metrics(path, 4) as handle:
        handle.write(json.dumps({"step": 4}) + "\n")
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [0, 1, 2, 3, 4]


def test_a_line_cut_short_by_a_kill_is_dropped_on_resume(tmp_path: Path) -> None:
    """A run killed mid-write leaves half a line; the resumed run drops it with the steps
    after its checkpoint, and appends whole lines after it."""
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"step": s}) + "\n" for s in range(3)) + '{"step": 3, "rew')
    with open_metrics(path, 2) as handle:
        handle.write(json.dumps({"step": 2}) + "\n")
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [0, 1, 2]
