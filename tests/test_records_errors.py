"""Records and the exception tree."""

from __future__ import annotations

import pickle

import attrs
import numpy as np
import pytest

import nemogym_sdk as ng
from nemogym_sdk import errors


def test_rollout_is_frozen_and_evolvable() -> None:
    """Fields cannot be assigned; attrs.evolve makes a changed copy."""
    rollout = ng.Rollout.failed(ng.RolloutStatus.TIMEOUT, 2, error="late")
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        rollout.reward = 1.0  # type: ignore[misc]
    tagged = attrs.evolve(rollout, row_id="f:1", repeat_index=3)
    assert (tagged.row_id, tagged.repeat_index, tagged.status) == (
        "f:1",
        3,
        ng.RolloutStatus.TIMEOUT,
    )
    assert tagged != rollout and attrs.evolve(tagged, row_id=None, repeat_index=None) == rollout


def test_rollout_rejects_misaligned_arrays() -> None:
    """Arrays of different lengths are refused with a message naming the counts."""
    with pytest.raises(ValueError, match="completion_ids has 2 tokens, env_mask 1"):
        ng.Rollout(prompt_ids=[1], completion_ids=[1, 2], env_mask=[1], logprobs=[0.0], reward=0)


def test_failed_needs_a_failure_status() -> None:
    """Rollout.failed refuses OK."""
    with pytest.raises(ValueError):
        ng.Rollout.failed(ng.RolloutStatus.OK, 2)


def test_rollout_pickles() -> None:
    """Rollouts survive pickling (they cross process boundaries)."""
    rollout = ng.parse_agent_response(
        {
            "response": {
                "output": [
                    {
                        "type": "function_call",
                        "prompt_token_ids": [1],
                        "generation_token_ids": [5],
                        "generation_log_probs": [-1.0],
                    }
                ]
            },
            "reward": 2.0,
            "reward_components": {"a": 2.0},
        },
        2,
    )
    assert pickle.loads(pickle.dumps(rollout)) == rollout


LEAVES = {
    errors.ConfigError: ValueError,
    errors.DataError: ValueError,
    errors.RowError: ValueError,
    errors.DriftError: ValueError,
    errors.DiscoveryError: LookupError,
    errors.UnknownAgentError: KeyError,
    errors.TransportError: ConnectionError,
    errors.DeadlineError: TimeoutError,
    errors.NotReadyError: TimeoutError,
    errors.ServerError: errors.NemoGymError,
    errors.LoraSyncError: errors.ServerError,
    errors.UsageError: RuntimeError,
}


@pytest.mark.parametrize(("cls", "builtin"), LEAVES.items(), ids=lambda c: c.__name__)
def test_errors_are_builtin_compatible(cls: type[Exception], builtin: type[Exception]) -> None:
    """Every error is a NemoGymError and the builtin it refines."""
    assert issubclass(cls, errors.NemoGymError) and issubclass(cls, builtin)


def test_every_error_is_listed() -> None:
    """The tree above covers every exception class the module exports."""
    exported = {getattr(errors, name) for name in errors.__all__} - {errors.NemoGymError}
    assert exported == set(LEAVES)


@pytest.mark.parametrize(
    "error",
    [
        errors.RowError("bad", "f.jsonl", 3),
        errors.DriftError("report"),
        errors.ServerError("HTTP 500", 500, "body"),
        errors.UnknownAgentError("no agent 'x'"),
        errors.DeadlineError("late"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_errors_pickle_with_context(error: Exception) -> None:
    """Errors and their attributes survive a pickle round trip."""
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is type(error) and str(copy) == str(error)
    assert vars(copy) == vars(error)


def test_unknown_agent_message_reads_as_a_sentence() -> None:
    """UnknownAgentError is a KeyError without KeyError's quoting."""
    assert str(errors.UnknownAgentError("no agent named 'x'")) == "no agent named 'x'"


def _batch() -> ng.Batch:
    rollouts = [
        ng.Rollout(
            prompt_ids=[1, 2],
            completion_ids=[3, 4],
            env_mask=[1, 0],
            logprobs=[-0.5, 0.0],
            reward=1.0,
            num_turns=1,
            reward_components={"a": 1.0},
        ),
        ng.Rollout.failed(ng.RolloutStatus.TIMEOUT, 2, error="slow"),
    ]
    return ng.collate(rollouts, pad_token_id=0)


def test_batch_arrays_are_read_only_like_rollouts() -> None:
    """Every array of a Batch, reward components included, refuses writes."""
    batch = _batch()
    arrays = {
        field.name: getattr(batch, field.name)
        for field in attrs.fields(ng.Batch)
        if isinstance(getattr(batch, field.name), np.ndarray)
    }
    assert len(arrays) == 13  # versions included
    arrays.update({f"reward_components[{k}]": v for k, v in batch.reward_components.items()})
    for name, array in arrays.items():
        assert not array.flags.writeable, name
        with pytest.raises(ValueError, match="read-only"):
            array[...] = 0
    assert pickle.loads(pickle.dumps(batch)).rewards.tolist() == batch.rewards.tolist()


def test_batch_wraps_callers_arrays_without_freezing_them() -> None:
    """Arrays handed to Batch are wrapped in read-only views; the caller's stay writable."""
    batch = _batch()
    mine = np.array(batch.rewards)
    again = attrs.evolve(batch, rewards=mine)
    assert not again.rewards.flags.writeable and mine.flags.writeable
    mine[0] = 7.0
    assert again.rewards[0] == 7.0  # a view, not a copy
