"""The training set (rows by stable id, opaque JSON) and the group schedule of each rank."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from nemogym_sdk import ConfigError
from nemogym_sdk.adapters.axolotl import NemoGymSettings
from nemogym_sdk.adapters.axolotl.dataset import build_dataset, dataset_records, row_of
from nemogym_sdk.adapters.axolotl.schedule import GroupSchedule

PROMPT = [
    {"role": "system", "content": "Reply with lowercase letters only."},
    {"role": "user", "content": [{"type": "input_text", "text": "Play Wordle!"}]},
]


def _write(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def _settings(*paths: Path, **keys: Any) -> NemoGymSettings:
    return NemoGymSettings.from_cfg({"nemo_gym_datasets": [str(p) for p in paths], **keys})


def test_rows_sharing_a_prompt_stay_distinct(tmp_path: Path) -> None:
    """Two rows with the same prompt but different tasks keep their own id and data: a
    rollout gets its row from its own record, never by prompt text (axolotl keyed a lookup
    by the prompt's text, so the last such row won: W-DATA-1)."""
    path = _write(
        tmp_path / "wordle.jsonl",
        [
            {
                "responses_create_params": {"input": PROMPT},
                "target": "crane",
                "agent_ref": {"name": "a"},
            },
            {
                "responses_create_params": {"input": PROMPT},
                "target": "slide",
                "agent_ref": {"name": "b"},
            },
        ],
    )
    dataset = build_dataset(_settings(path))
    assert len(dataset) == 2
    assert dataset[0]["prompt"] == dataset[1]["prompt"]
    rows = [row_of(dataset[i]) for i in range(2)]
    assert [r.row_id for r in rows] == [f"{path}:1", f"{path}:2"]
    assert [r.data["target"] for r in rows] == ["crane", "slide"]
    assert [r.agent_name for r in rows] == ["a", "b"]


def test_prompt_column_keeps_every_message_as_text(tmp_path: Path) -> None:
    """The prompt the trainer sees includes the system message; content parts become text."""
    path = _write(tmp_path / "rows.jsonl", [{"responses_create_params": {"input": PROMPT}}])
    (record,) = dataset_records(_settings(path))
    assert record["prompt"] == [
        {"role": "system", "content": "Reply with lowercase letters only."},
        {"role": "user", "content": "Play Wordle!"},
    ]


def test_heterogeneous_rows_arrive_exactly_as_written(tmp_path: Path) -> None:
    """Rows of two environments with clashing field types load (no Arrow unification) and
    come back without None-filled keys."""
    first = {"responses_create_params": {"input": "a", "max_output_tokens": 5}, "metadata": "x"}
    second = {"responses_create_params": {"input": "b"}, "metadata": {"level": 3}}
    a = _write(tmp_path / "a.jsonl", [first])
    b = _write(tmp_path / "b.jsonl", [second])
    dataset = build_dataset(_settings(a, b))
    assert [dict(row_of(dataset[i]).data) for i in range(2)] == [first, second]


def test_max_samples_is_a_seeded_subset_in_file_order(tmp_path: Path) -> None:
    rows = [{"responses_create_params": {"input": str(i)}, "i": i} for i in range(20)]
    path = _write(tmp_path / "rows.jsonl", rows)
    spec = [{"path": str(path), "max_samples": 5}]
    one = [row_of(r).data["i"] for r in dataset_records(_settings(nemo_gym_datasets=spec, seed=1))]
    again = [
        row_of(r).data["i"] for r in dataset_records(_settings(nemo_gym_datasets=spec, seed=1))
    ]
    other = [
        row_of(r).data["i"] for r in dataset_records(_settings(nemo_gym_datasets=spec, seed=2))
    ]
    assert one == again == sorted(one) and len(one) == 5
    assert other != one


def test_schedule_gives_each_rank_disjoint_whole_rows_every_call() -> None:
    """Ranks compute the same permutation from the seed and take disjoint slices; over an
    epoch every row is played exactly once."""
    ranks = [GroupSchedule(num_rows=12, rows_per_rank=2, rank=r, world=3, seed=5) for r in range(3)]
    seen: list[int] = []
    for _ in range(2):
        calls = [s.next_indices() for s in ranks]
        flat = [i for call in calls for i in call]
        assert len(flat) == len(set(flat)) == 6
        seen += flat
    assert sorted(seen) == list(range(12))
    assert all(s.epoch == 0 for s in ranks)
    again = GroupSchedule(num_rows=12, rows_per_rank=2, rank=0, world=3, seed=5)
    assert (
        again.next_indices()
        == GroupSchedule(num_rows=12, rows_per_rank=2, rank=0, world=3, seed=5).next_indices()
    )


def test_schedule_wraps_into_a_new_epoch() -> None:
    schedule = GroupSchedule(num_rows=3, rows_per_rank=2, seed=0)
    taken = [schedule.next_indices() for _ in range(3)]
    flat = [i for call in taken for i in call]
    assert sorted(flat) == [0, 0, 1, 1, 2, 2]
    assert schedule.epoch == 1
    with pytest.raises(ConfigError):
        GroupSchedule(num_rows=3, rows_per_rank=1, rank=2, world=2)
