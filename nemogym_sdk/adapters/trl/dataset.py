"""NeMo Gym rows as a TRL training dataset whose prompts carry their row's id.

TRL hands ``rollout_func`` only each example's ``prompt``, so the row's identity has to
travel inside it: every message of the prompt carries the row id under
:data:`ROW_ID_KEY`. The rollout function plays the row it names, never a row found by
prompt text (rows that share a prompt, such as "Play Wordle!" with different targets,
would collide). The row itself stays out of the dataset: Arrow would unify heterogeneous
NeMo Gym rows into one schema and fill the gaps with ``None``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from nemogym_sdk.errors import ConfigError, DataError
from nemogym_sdk.records import TaskRow
from nemogym_sdk.wire import input_messages

__all__ = ["ROW_ID_KEY", "make_dataset", "prompt_row_id"]

ROW_ID_KEY = "nemo_gym_row_id"
"""Key of the row id in every prompt message, and the name of the dataset's id column
(reward functions receive it as a keyword argument)."""


def _prompt(row: TaskRow) -> list[dict[str, str]]:
    messages = input_messages(row.data)
    if not messages:
        raise DataError(
            f"row {row.row_id} has no message in responses_create_params.input to show as the "
            "prompt"
        )
    return [{**message, ROW_ID_KEY: row.row_id} for message in messages]


def make_dataset(rows: Iterable[TaskRow]) -> Any:
    """A ``datasets.Dataset`` with columns ``prompt`` and ``nemo_gym_row_id``, one per row.

    ``prompt`` is the row's input messages (text content) with the row id in each message;
    pass the same rows to :func:`~nemogym_sdk.adapters.trl.make_rollout_func`. Raises
    ``ConfigError`` when two rows share an id.
    """
    from datasets import Dataset

    records = []
    seen: set[str] = set()
    for row in rows:
        if row.row_id in seen:
            raise ConfigError(f"two rows share the id {row.row_id!r}; row ids must be unique")
        seen.add(row.row_id)
        records.append({"prompt": _prompt(row), ROW_ID_KEY: row.row_id})
    if not records:
        raise ConfigError("make_dataset needs at least one row")
    return Dataset.from_list(records)


def prompt_row_id(prompt: Any) -> str:
    """The row id a prompt built by :func:`make_dataset` carries.

    Raises ``DataError`` for a prompt without one (a dataset not built by ``make_dataset``)
    or with two different ids.
    """
    ids = set()
    if isinstance(prompt, Sequence) and not isinstance(prompt, str):
        ids = {m.get(ROW_ID_KEY) for m in prompt if isinstance(m, Mapping)}
    ids.discard(None)
    if len(ids) != 1:
        shown = repr(prompt)
        shown = shown if len(shown) <= 120 else shown[:117] + "..."
        raise DataError(
            f"the prompt {shown} does not name exactly one NeMo Gym row (key {ROW_ID_KEY!r} "
            "in its messages); build the training dataset with "
            "nemogym_sdk.adapters.trl.make_dataset(rows) and pass the same rows to "
            "make_rollout_func"
        )
    return str(ids.pop())
