"""The training set: NeMo Gym JSONL rows as opaque JSON with their stable ids.

Each row becomes one record with three columns:

- ``nemo_gym_row_id``: the row's stable id, ``<path>:<line>``;
- ``nemo_gym_row``: the row itself as a JSON string, so that rows of different
  environments never go through Arrow's schema unification (which fills missing keys
  with ``None`` and fails on keys whose types differ);
- ``prompt``: the row's input messages as ``{role, content}`` text, for the trainer's own
  generation in single-turn mode and for logs. Rows are never looked up by it.

A rollout gets its row back from its own record (``row_of``), never by prompt text, so
rows that share a prompt (templated tasks) stay distinct.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from nemogym_sdk import _extras
from nemogym_sdk.adapters.axolotl._deps import PLUGIN
from nemogym_sdk.adapters.axolotl.settings import NemoGymSettings
from nemogym_sdk.data import load_rows
from nemogym_sdk.errors import DataError
from nemogym_sdk.records import TaskRow

if TYPE_CHECKING:
    from datasets import Dataset

__all__ = [
    "PROMPT",
    "ROW",
    "ROW_ID",
    "build_dataset",
    "dataset_records",
    "prompt_messages",
    "row_of",
]

ROW_ID = "nemo_gym_row_id"
ROW = "nemo_gym_row"
PROMPT = "prompt"


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        return "".join(
            part["text"]
            for part in content
            if isinstance(part, Mapping) and isinstance(part.get("text"), str)
        )
    return ""


def prompt_messages(row: TaskRow) -> list[dict[str, str]]:
    """The row's input as chat messages with text content (system messages included).

    A string input is one user message; items without a role (tool calls, their outputs)
    are left out here and reach the environment only inside the row.
    """
    params = row.data.get("responses_create_params")
    source = params.get("input") if isinstance(params, Mapping) else None
    if isinstance(source, str):
        return [{"role": "user", "content": source}]
    messages = []
    for item in source if isinstance(source, Sequence) else ():
        if isinstance(item, Mapping) and isinstance(item.get("role"), str):
            messages.append({"role": item["role"], "content": _text(item.get("content"))})
    return messages


def dataset_records(settings: NemoGymSettings) -> list[dict[str, Any]]:
    """One record per row of every ``nemo_gym_datasets`` file, in file order."""
    records = []
    for spec in settings.datasets:
        if spec.max_samples is None:
            rows = load_rows(spec.path)
        else:  # a seeded random subset, back in file order (the trainer shuffles)
            rows = load_rows(spec.path, seed=settings.seed, max_samples=spec.max_samples)
            rows.sort(key=lambda row: row.line or 0)
        for row in rows:
            records.append(
                {
                    ROW_ID: row.row_id,
                    ROW: json.dumps(row.data, separators=(",", ":")),
                    PROMPT: prompt_messages(row),
                }
            )
    return records


def row_of(record: Mapping[str, Any]) -> TaskRow:
    """The ``TaskRow`` a dataset record carries (its own JSON and id, no lookup)."""
    row_id, text = record.get(ROW_ID), record.get(ROW)
    if not isinstance(row_id, str) or not isinstance(text, str):
        raise DataError(
            f"a training record has no {ROW_ID}/{ROW} columns (keys: {sorted(record)}); the "
            "NeMo Gym plugin's data producer needs the dataset its load_datasets built"
        )
    data = json.loads(text)
    return TaskRow(row_id=row_id, data=data)


def build_dataset(settings: NemoGymSettings) -> Dataset:
    """The records as a Hugging Face ``datasets.Dataset`` (imported here, lazily)."""
    try:
        from datasets import Dataset
    except ImportError as exc:  # pragma: no cover - axolotl brings datasets
        raise ImportError(_extras.needs(PLUGIN, ["datasets"], "axolotl")) from exc
    return Dataset.from_list(dataset_records(settings))
