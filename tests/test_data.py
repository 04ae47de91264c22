"""Reading NeMo Gym JSONL rows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nemogym_sdk import ConfigError, expand_groups, load_rows
from nemogym_sdk.errors import RowError

ROW = {"responses_create_params": {"input": "hi"}, "agent_ref": {"name": "agent_a"}}


def _write(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n")
    return path


def test_rows_have_stable_ids_and_skip_blank_lines(tmp_path: Path) -> None:
    """Ids are path:line (1-based), blank lines are skipped, the JSON is kept whole."""
    path = _write(tmp_path / "a.jsonl", [json.dumps(ROW), "", "   ", json.dumps(ROW | {"x": 1})])
    rows = load_rows(path)
    assert [r.row_id for r in rows] == [f"{path}:1", f"{path}:4"]
    assert [r.line for r in rows] == [1, 4]
    assert rows[1].data == ROW | {"x": 1}
    assert rows[0].agent_name == "agent_a"


def test_bad_line_reports_file_and_line(tmp_path: Path) -> None:
    """A broken line raises RowError naming the file and line."""
    path = _write(tmp_path / "bad.jsonl", [json.dumps(ROW), '{"responses_create_params": '])
    with pytest.raises(RowError) as info:
        load_rows(path)
    assert (info.value.path, info.value.line) == (str(path), 2)
    assert str(info.value).startswith(f"{path}:2: not valid JSON")
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize(
    ("line", "message"),
    [("[1, 2]", "expected a JSON object"), ('{"agent_ref": {}}', "responses_create_params")],
)
def test_rows_must_be_objects_with_params(tmp_path: Path, line: str, message: str) -> None:
    """Non-objects and rows without responses_create_params are rejected with a reason."""
    path = _write(tmp_path / "bad.jsonl", [line])
    with pytest.raises(RowError, match=message):
        load_rows(path)


def test_seeded_sampling_is_reproducible(tmp_path: Path) -> None:
    """The same seed picks the same subset across files; no seed keeps file order."""
    a = _write(tmp_path / "a.jsonl", [json.dumps(ROW | {"i": i}) for i in range(20)])
    b = _write(tmp_path / "b.jsonl", [json.dumps(ROW | {"i": 20 + i}) for i in range(20)])
    first = [r.row_id for r in load_rows([a, b], seed=7, max_samples=10)]
    again = [r.row_id for r in load_rows([a, b], seed=7, max_samples=10)]
    other = [r.row_id for r in load_rows([a, b], seed=8, max_samples=10)]
    assert first == again and first != other and len(set(first)) == 10
    assert [r.data["i"] for r in load_rows([a, b], max_samples=3)] == [0, 1, 2]


def test_missing_file_and_bad_arguments(tmp_path: Path) -> None:
    """A missing file raises FileNotFoundError; negative max_samples is a ConfigError."""
    with pytest.raises(FileNotFoundError):
        load_rows(tmp_path / "nope.jsonl")
    with pytest.raises(ConfigError):
        load_rows([], max_samples=-1)


def test_tilde_paths_expand(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """~ paths are expanded (the seed joined them to a base dir and failed)."""
    monkeypatch.setenv("HOME", str(tmp_path))
    _write(tmp_path / "r.jsonl", [json.dumps(ROW)])
    (row,) = load_rows("~/r.jsonl")
    assert row.row_id == "~/r.jsonl:1"


def test_expand_groups_keeps_groups_together(tmp_path: Path) -> None:
    """Two rows with num_generations 3 give aaabbb with repeat indices 0..2."""
    path = _write(tmp_path / "a.jsonl", [json.dumps(ROW), json.dumps(ROW)])
    requests = expand_groups(load_rows(path), 3)
    assert [(r.row.line, r.repeat_index) for r in requests] == [
        (1, 0),
        (1, 1),
        (1, 2),
        (2, 0),
        (2, 1),
        (2, 2),
    ]
    with pytest.raises(ConfigError):
        expand_groups([], 0)
