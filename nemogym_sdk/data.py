"""NeMo Gym JSONL datasets as opaque rows with stable ids.

Each non-blank line of a NeMo Gym JSONL file is a JSON object with
``responses_create_params`` (the OpenAI Responses request: input messages, tools,
sampling parameters, metadata), an optional ``agent_ref`` and any task fields the
environment's verifier reads. Rows are kept exactly as decoded, never flattened into
a table (heterogeneous rows would be unified and ``None``-filled), and identified by
``<path>:<line>``, never by prompt text (rows that share a prompt would collide).
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Iterable, Sequence
from os import PathLike
from pathlib import Path

from nemogym_sdk.errors import ConfigError, RowError
from nemogym_sdk.records import RolloutRequest, TaskRow
from nemogym_sdk.wire import RESPONSES_CREATE_PARAMS, create_params

__all__ = ["expand_groups", "load_rows", "mixed_seed", "read_rows", "rollout_seed"]

StrPath = str | PathLike[str]


def read_rows(path: StrPath) -> list[TaskRow]:
    """Every row of one JSONL file, in file order; blank lines are skipped.

    Raises ``FileNotFoundError`` for a missing file and ``RowError`` (with the file and
    1-based line number) for a line that is not a JSON object with
    ``responses_create_params``.
    """
    resolved = Path(path).expanduser()
    name = str(path)
    rows: list[TaskRow] = []
    with resolved.open("rb") as handle:
        for number, raw in enumerate(handle, start=1):
            if not raw.strip():
                continue
            try:
                data = json.loads(raw)
            except (UnicodeDecodeError, json.JSONDecodeError) as exc:
                raise RowError(f"not valid JSON: {exc}", name, number) from None
            if not isinstance(data, dict):
                raise RowError(f"expected a JSON object, got {type(data).__name__}", name, number)
            if create_params(data) is None:
                raise RowError(f"the row has no '{RESPONSES_CREATE_PARAMS}' object", name, number)
            rows.append(TaskRow(row_id=f"{name}:{number}", data=data, source=name, line=number))
    return rows


def load_rows(
    paths: StrPath | Sequence[StrPath],
    *,
    seed: int | None = None,
    max_samples: int | None = None,
) -> list[TaskRow]:
    """Read NeMo Gym JSONL files into rows with stable ids.

    Args:
        paths: one path or several; ``~`` is expanded. Ids keep the path as given.
        seed: shuffle the rows with ``random.Random(seed)``; None keeps file order.
        max_samples: keep at most this many rows (after shuffling, so a seed picks a
            reproducible random subset).

    Raises:
        FileNotFoundError: a path does not exist.
        RowError: a line is not a JSON object with ``responses_create_params``.
    """
    if max_samples is not None and max_samples < 0:
        raise ConfigError(f"max_samples must be >= 0, got {max_samples}")
    path_list = [paths] if isinstance(paths, (str, PathLike)) else list(paths)
    rows = [row for path in path_list for row in read_rows(path)]
    if seed is not None:
        random.Random(seed).shuffle(rows)
    if max_samples is not None:
        rows = rows[:max_samples]
    return rows


def expand_groups(rows: Iterable[TaskRow], num_generations: int) -> list[RolloutRequest]:
    """Each row repeated ``num_generations`` times, a group at a time (``aabbcc``).

    GRPO compares the rollouts of one row with each other, so a group's rollouts stay
    together and carry their ``repeat_index``.
    """
    if num_generations < 1:
        raise ConfigError(f"num_generations must be >= 1, got {num_generations}")
    return [
        RolloutRequest(row=row, repeat_index=index)
        for row in rows
        for index in range(num_generations)
    ]


def rollout_seed(seed: int, group: int, index: int) -> int:
    """The sampling seed of rollout ``index`` of group ``group`` in a run seeded ``seed``
    (``RolloutRequest.seed``): `mixed_seed` of the three, the same wherever it is computed,
    so a group played again draws its tokens again."""
    return mixed_seed(seed, group, index)


def mixed_seed(*parts: int) -> int:
    """A 63-bit seed hashed from ``parts`` (as the samplers' own draws are 63 bits): the same
    parts give the same seed in any process, and any change of one gives another."""
    digest = hashlib.blake2b(":".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1
