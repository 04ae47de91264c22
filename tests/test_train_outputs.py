"""nemogym-train's outputs without servers: resumed metrics, the library's warnings."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from nemogym_sdk.train.outputs import library_warnings, open_metrics


def test_resumed_metrics_drop_the_steps_after_the_checkpoint(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"step": s}) + "\n" for s in range(6)))
    with open_metrics(path, 4) as handle:
        handle.write(json.dumps({"step": 4}) + "\n")
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [0, 1, 2, 3, 4]


def test_a_run_from_step_0_keeps_no_earlier_line(tmp_path: Path) -> None:
    """A run killed after its first step's line but before its first checkpoint, started
    again without ``--resume``: step 0 is logged once, by the new run."""
    path = tmp_path / "metrics.jsonl"
    path.write_text(json.dumps({"step": 0, "old": True}) + "\n")
    with open_metrics(path, 0) as handle:
        handle.write(json.dumps({"step": 0}) + "\n")
    assert [json.loads(line) for line in path.read_text().splitlines()] == [{"step": 0}]


def test_a_line_cut_short_by_a_kill_is_dropped_on_resume(tmp_path: Path) -> None:
    """A run killed mid-write leaves half a line; the resumed run drops it with the steps
    after its checkpoint, and appends whole lines after it."""
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"step": s}) + "\n" for s in range(3)) + '{"step": 3, "rew')
    with open_metrics(path, 2) as handle:
        handle.write(json.dumps({"step": 2}) + "\n")
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [0, 1, 2]


def test_the_library_warns_in_the_trainer_s_voice(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A warning of an SDK module (a server slow to stop) reads ``nemogym-train: ...`` while
    the trainer runs; info stays quiet; after the run the handler is gone."""
    monkeypatch.setattr(logging.getLogger(), "handlers", [])  # a program that set up nothing
    stopping = logging.getLogger("nemogym_sdk.processes.process")
    with library_warnings():
        stopping.warning("sampler (pid %d) ignored SIGTERM for %.1f s", 7, 5.0)
        stopping.info("stopped")
    assert capsys.readouterr().err == "nemogym-train: sampler (pid 7) ignored SIGTERM for 5.0 s\n"
    assert logging.getLogger("nemogym_sdk").handlers == []


def test_a_program_that_configured_logging_keeps_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    records: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record.getMessage())

    monkeypatch.setattr(logging.getLogger(), "handlers", [Keep()])
    with library_warnings():
        logging.getLogger("nemogym_sdk.train").warning("slow")
    assert records == ["slow"] and capsys.readouterr().err == ""
