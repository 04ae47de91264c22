"""The env-mask builder and collation."""

from __future__ import annotations

import attrs
import numpy as np
import pytest

from nemogym_sdk import (
    ConfigError,
    Rollout,
    RolloutStatus,
    collate,
    parse_agent_response,
)
from nemogym_sdk.masks import CompletionBuilder


def test_builder_interleaves_segments() -> None:
    """model [30 31] + env [100 101 102] + model [40 41] -> mask [1 1 0 0 0 1 1]."""
    builder = CompletionBuilder()
    builder.add_model([30, 31], [-0.1, -0.2])
    builder.add_env([100, 101, 102])
    builder.add_model([40, 41], [-0.3, -0.4])
    completion = builder.build()
    assert completion.ids.tolist() == [30, 31, 100, 101, 102, 40, 41]
    assert completion.env_mask.tolist() == [1, 1, 0, 0, 0, 1, 1]
    assert completion.logprobs.tolist() == [-0.1, -0.2, 0.0, 0.0, 0.0, -0.3, -0.4]
    assert completion.num_model_tokens == 4
    assert len(builder) == 7


def test_builder_refuses_missing_logprobs() -> None:
    """A logprob count that differs from the token count raises instead of padding."""
    with pytest.raises(ValueError, match="1 logprobs for 2 generated tokens"):
        CompletionBuilder().add_model([30, 31], [-0.1])


def test_empty_builder_builds_empty_arrays() -> None:
    """No segments give zero-length aligned arrays."""
    completion = CompletionBuilder().build()
    assert len(completion) == 0
    assert completion.env_mask.dtype == np.int8


def test_truncate_keeps_arrays_aligned() -> None:
    """Truncating to 3 cuts all three arrays and flags it; a longer limit is a no-op."""
    builder = CompletionBuilder()
    builder.add_model([1, 2], [-1.0, -2.0])
    builder.add_env([3, 4])
    completion = builder.build()
    cut = completion.truncate(3)
    assert (cut.ids.tolist(), cut.env_mask.tolist(), cut.truncated) == ([1, 2, 3], [1, 1, 0], True)
    assert completion.truncate(4) is completion


def _rollout(prompt: list[int], completion: list[int], mask: list[int]) -> Rollout:
    return Rollout(
        prompt_ids=prompt,
        completion_ids=completion,
        env_mask=mask,
        logprobs=[-0.5 * m for m in mask],
        reward=1.0,
        num_turns=1,
    )


def test_collate_pads_left_and_right_with_masks_from_lengths() -> None:
    """Prompts [5] and [6 7 8]; completions [2 2] and [9]; pad id 2 equals eos.

    prompt_ids     [[2 2 5] [6 7 8]]   prompt_mask     [[0 0 1] [1 1 1]]
    completion_ids [[2 2]   [9 2]]     completion_mask [[1 1]   [1 0]]
    The eos tokens of row 0 stay in completion_mask although they equal the pad id.
    """
    batch = collate([_rollout([5], [2, 2], [1, 1]), _rollout([6, 7, 8], [9], [0])], pad_token_id=2)
    assert batch.prompt_ids.tolist() == [[2, 2, 5], [6, 7, 8]]
    assert batch.prompt_mask.tolist() == [[0, 0, 1], [1, 1, 1]]
    assert batch.completion_ids.tolist() == [[2, 2], [9, 2]]
    assert batch.completion_mask.tolist() == [[1, 1], [1, 0]]
    assert batch.env_mask.tolist() == [[1, 1], [0, 1]]
    assert batch.loss_mask.tolist() == [[1, 1], [0, 0]]
    assert batch.logprobs.tolist() == [[-0.5, -0.5], [0.0, 0.0]]
    assert batch.logprobs.dtype == np.float32


def test_collate_keeps_failures_and_marks_them() -> None:
    """A failed rollout is a length-1 row with ok False and its status kept."""
    failed = Rollout.failed(RolloutStatus.TIMEOUT, 2, error="deadline")
    batch = collate([_rollout([1], [3, 4], [1, 1]), failed], pad_token_id=0)
    assert batch.completion_mask.sum(axis=1).tolist() == [2, 1]
    assert batch.ok.tolist() == [True, False]
    assert batch.statuses.tolist() == ["ok", "timeout"]
    assert batch.loss_mask[1].tolist() == [0, 0]


def test_loss_mask_is_zero_on_every_row_that_is_not_ok() -> None:
    """Rows [1 1] OK, [1 1] DRIFT and [1 0] MASKED keep their env masks, but only the OK row
    has loss-mask tokens: a loop that trains on ``loss_mask`` alone never trains a failure.

    env_mask   [[1 1] [1 1] [1 0]]     loss_mask [[1 1] [0 0] [0 0]]
    """
    drift = attrs.evolve(_rollout([1], [3, 4], [1, 1]), status=RolloutStatus.DRIFT)
    masked = attrs.evolve(_rollout([1], [5, 6], [1, 0]), status=RolloutStatus.MASKED)
    batch = collate([_rollout([1], [3, 4], [1, 1]), drift, masked], pad_token_id=0)
    assert batch.env_mask.tolist() == [[1, 1], [1, 1], [1, 0]]
    assert batch.loss_mask.tolist() == [[1, 1], [0, 0], [0, 0]]
    assert batch.loss_mask.dtype == np.int8


def test_collate_expands_forks_with_episode_index() -> None:
    """Forks become rows right after their rollout and share its episode index."""
    drifting = {
        "response": {
            "output": [
                {
                    "type": "function_call",
                    "prompt_token_ids": [1],
                    "generation_token_ids": [10],
                    "generation_log_probs": [-1.0],
                },
                {
                    "type": "function_call",
                    "prompt_token_ids": [9, 9],
                    "generation_token_ids": [20],
                    "generation_log_probs": [-2.0],
                },
            ]
        },
        "reward": 1.0,
    }
    forked = parse_agent_response(drifting, 2, on_drift="fork")
    plain = _rollout([4], [5], [1])
    batch = collate([forked, plain], pad_token_id=0)
    assert batch.episode_index.tolist() == [0, 0, 1]
    assert collate([forked, plain], pad_token_id=0, expand_forks=False).episode_index.tolist() == [
        0,
        1,
    ]


def test_collate_reward_components_and_identity() -> None:
    """Reward components become per-name arrays with NaN where a row lacks the name."""
    import attrs

    first = attrs.evolve(
        _rollout([1], [2], [1]), reward_components={"a": 1.0}, row_id="f:1", repeat_index=0
    )
    second = attrs.evolve(
        _rollout([1], [2], [1]), reward_components={"b": 2.0}, row_id="f:1", repeat_index=1
    )
    batch = collate([first, second], pad_token_id=0)
    assert batch.reward_components["a"][0] == 1.0 and np.isnan(batch.reward_components["a"][1])
    assert batch.row_ids == ("f:1", "f:1")
    assert batch.repeat_indices.tolist() == [0, 1]


def test_collate_pad_to_multiple() -> None:
    """pad_to_multiple_of rounds both padded lengths up."""
    batch = collate([_rollout([1, 2, 3], [4], [1])], pad_token_id=0, pad_to_multiple_of=4)
    assert batch.prompt_ids.shape == (1, 4)
    assert batch.completion_ids.shape == (1, 4)


def test_collate_rejects_nothing_and_bad_padding() -> None:
    """An empty list and a non-positive multiple raise ConfigError."""
    with pytest.raises(ConfigError):
        collate([], pad_token_id=0)
    with pytest.raises(ConfigError):
        collate([_rollout([1], [2], [1])], pad_token_id=0, pad_to_multiple_of=0)


def test_to_torch_dtypes_and_values() -> None:
    """to_torch gives int64 ids and masks, float32 logprobs and rewards, bool ok; its
    loss_mask is 0 on a row that is not OK (the MASKED row [3 4], mask [1 1])."""
    torch = pytest.importorskip("torch")
    masked = attrs.evolve(_rollout([5], [3, 4], [1, 1]), status=RolloutStatus.MASKED)
    batch = collate([_rollout([5], [2, 2], [1, 0]), masked], pad_token_id=2)
    tensors = batch.to_torch("cpu")
    assert tensors["completion_ids"].dtype == torch.int64
    assert tensors["logprobs"].dtype == torch.float32
    assert tensors["ok"].dtype == torch.bool
    assert tensors["loss_mask"].tolist() == [[1, 0], [0, 0]]
    assert tensors["env_mask"].tolist() == [[1, 0], [1, 1]]
    assert tensors["rewards"].tolist() == [1.0, 1.0]
