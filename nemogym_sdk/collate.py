"""Padding rollouts into a ``Batch`` of numpy arrays.

Prompts are left-padded (so every prompt ends where its completion starts) and
completions right-padded. Masks come from the recorded lengths, never from comparing
ids with ``pad_token_id``: the pad id may equal the eos id, and comparing would hide
real eos tokens. The env mask is padded with 1 (TRL's convention: padding is excluded
by ``completion_mask``), sampling logprobs with 0.0, policy versions with -1, and the loss
mask is ``completion_mask * env_mask`` on rows that are ``OK``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np

from nemogym_sdk.errors import ConfigError
from nemogym_sdk.records import Batch, Rollout

__all__ = ["collate"]


def collate(
    rollouts: Iterable[Rollout],
    *,
    pad_token_id: int,
    expand_forks: bool = True,
    pad_to_multiple_of: int | None = None,
) -> Batch:
    """Pad rollouts into a ``Batch``.

    Args:
        rollouts: the rollouts, in the order the rows of the batch should have.
        pad_token_id: id written into padding positions (masks never depend on it).
        expand_forks: add each rollout's ``forks`` as rows right after it (they share
            ``episode_index``); with False, forks are dropped.
        pad_to_multiple_of: round ``P`` and ``T`` up to a multiple of this.

    Failed rollouts stay in the batch (they keep the seed contract's one-token shape);
    use ``Batch.ok`` to leave them out of the loss and the group baseline.
    """
    if pad_to_multiple_of is not None and pad_to_multiple_of < 1:
        raise ConfigError(f"pad_to_multiple_of must be >= 1, got {pad_to_multiple_of}")
    rows: list[Rollout] = []
    episode: list[int] = []
    for index, rollout in enumerate(rollouts):
        for sample in rollout.samples() if expand_forks else (rollout,):
            rows.append(sample)
            episode.append(index)
    if not rows:
        raise ConfigError("collate needs at least one rollout")

    B = len(rows)
    prompt_lens_B = np.fromiter((r.prompt_ids.shape[0] for r in rows), np.int64, B)
    completion_lens_B = np.fromiter((r.completion_ids.shape[0] for r in rows), np.int64, B)
    P = _round_up(int(prompt_lens_B.max()), pad_to_multiple_of)
    T = _round_up(int(completion_lens_B.max()), pad_to_multiple_of)

    # Each row is written once: its tokens, then its padding (no full-array pre-fill).
    prompt_ids_BP = np.empty((B, P), dtype=np.int64)
    completion_ids_BT = np.empty((B, T), dtype=np.int64)
    env_mask_BT = np.empty((B, T), dtype=np.int8)
    logprobs_BT = np.empty((B, T), dtype=np.float32)
    versions_BT = np.full((B, T), -1, dtype=np.int64)
    for b, rollout in enumerate(rows):
        start, t = P - int(prompt_lens_B[b]), int(completion_lens_B[b])
        prompt_ids_BP[b, :start] = pad_token_id
        prompt_ids_BP[b, start:] = rollout.prompt_ids
        completion_ids_BT[b, :t] = rollout.completion_ids
        completion_ids_BT[b, t:] = pad_token_id
        env_mask_BT[b, :t] = rollout.env_mask
        env_mask_BT[b, t:] = 1
        logprobs_BT[b, :t] = rollout.logprobs
        logprobs_BT[b, t:] = 0.0
        if rollout.versions is not None:
            versions_BT[b, :t] = rollout.versions
    # bool -> int8 is a view (same item size), not a copy
    prompt_mask_BP = (np.arange(P)[None, :] >= (P - prompt_lens_B)[:, None]).view(np.int8)
    completion_mask_BT = (np.arange(T)[None, :] < completion_lens_B[:, None]).view(np.int8)

    component_names = sorted({name for r in rows for name in r.reward_components})
    components = {
        name: np.array([r.reward_components.get(name, math.nan) for r in rows], dtype=np.float32)
        for name in component_names
    }
    return Batch(
        prompt_ids=prompt_ids_BP,
        prompt_mask=prompt_mask_BP,
        completion_ids=completion_ids_BT,
        completion_mask=completion_mask_BT,
        env_mask=env_mask_BT,
        logprobs=logprobs_BT,
        rewards=np.array([r.reward for r in rows], dtype=np.float32),
        statuses=np.array([r.status.value for r in rows], dtype=np.str_),
        truncated=np.array([r.truncated for r in rows], dtype=np.bool_),
        num_turns=np.array([r.num_turns for r in rows], dtype=np.int64),
        episode_index=np.array(episode, dtype=np.int64),
        row_ids=tuple(r.row_id for r in rows),
        repeat_indices=np.array(
            [-1 if r.repeat_index is None else r.repeat_index for r in rows], dtype=np.int64
        ),
        reward_components=components,
        versions=versions_BT,
    )


def _round_up(n: int, multiple: int | None) -> int:
    if multiple is None:
        return n
    return -(-n // multiple) * multiple
