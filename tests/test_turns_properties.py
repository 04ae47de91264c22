"""Property tests of the turn parser and collation over generated multi-turn episodes."""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from nemogym_sdk import (
    DriftError,
    DriftPolicy,
    Rollout,
    RolloutStatus,
    collate,
    parse_agent_response,
)
from nemogym_sdk.testing import Episode, episodes, json_values, mangled_responses, rollouts

pytestmark = pytest.mark.property

EOS = 2


def _assert_consistent(rollout: Rollout) -> None:
    n = len(rollout.completion_ids)
    assert len(rollout.env_mask) == n
    assert len(rollout.logprobs) == n
    assert set(np.unique(rollout.env_mask).tolist()) <= {0, 1}
    # environment tokens never carry a logprob
    assert np.all(rollout.logprobs[rollout.env_mask == 0] == 0.0)


@given(episodes(), st.sampled_from(list(DriftPolicy)))
def test_contiguous_episode_stitches_exactly(episode: Episode, policy: DriftPolicy) -> None:
    """A contiguous episode gives one OK sample that matches the turn-by-turn facts."""
    rollout = parse_agent_response(episode.response, EOS, on_drift=policy)
    assert rollout.status is RolloutStatus.OK
    assert rollout.forks == ()
    assert rollout.num_turns == len(episode.prompts)
    expected = episode.expected_sample(list(range(len(episode.prompts))))
    assert {k: rollout.to_dict()[k] for k in expected} == expected
    _assert_consistent(rollout)


@given(episodes())
def test_stitched_sequence_equals_last_prompt_plus_generation(episode: Episode) -> None:
    """prompt + completion reproduces the last turn's prompt + generation token for token."""
    rollout = parse_agent_response(episode.response, EOS)
    stitched = rollout.prompt_ids.tolist() + rollout.completion_ids.tolist()
    assert stitched == list(episode.prompts[-1] + episode.generations[-1])


@given(episodes(drift=True))
def test_every_model_token_carries_its_logprob(episode: Episode) -> None:
    """Mask-1 positions hold exactly the generated tokens with their logprobs, in order."""
    rollout = parse_agent_response(episode.response, EOS, on_drift=DriftPolicy.FORK)
    trained_ids: list[int] = []
    trained_lps: list[float] = []
    for sample in rollout.samples():
        _assert_consistent(sample)
        policy = sample.env_mask == 1
        trained_ids += sample.completion_ids[policy].tolist()
        trained_lps += sample.logprobs[policy].tolist()
    assert trained_ids == [t for gen in episode.generations for t in gen]
    assert trained_lps == [lp for lps in episode.logprobs for lp in lps]


@given(episodes(drift=True))
def test_fork_never_trains_a_token_twice(episode: Episode) -> None:
    """Forks split the episode at each drift; every sample is itself a contiguous stitch."""
    rollout = parse_agent_response(episode.response, EOS, on_drift=DriftPolicy.FORK)
    samples = rollout.samples()
    groups = episode.segments()
    assert len(samples) == len(groups)
    assert sum(s.num_turns for s in samples) == len(episode.prompts)
    for sample, turns in zip(samples, groups, strict=True):
        expected = episode.expected_sample(turns)
        assert {k: sample.to_dict()[k] for k in expected} == expected
        assert sample.status is RolloutStatus.OK
        assert sample.reward == episode.reward
    assert [s.drift is not None for s in samples[1:]] == [True] * (len(samples) - 1)


@given(episodes(drift=True))
def test_mark_keeps_the_tokens_before_the_first_drift(episode: Episode) -> None:
    """Under MARK, a drifting episode is DRIFT with the contiguous part before the drift."""
    rollout = parse_agent_response(episode.response, EOS, on_drift=DriftPolicy.MARK)
    first_group = episode.segments()[0]
    expected = episode.expected_sample(first_group)
    assert {k: rollout.to_dict()[k] for k in expected} == expected
    if episode.drift_turns:
        assert rollout.status is RolloutStatus.DRIFT
        assert rollout.drift is not None
        assert rollout.drift.turn_index == min(episode.drift_turns)
        assert rollout.error == str(rollout.drift)
    else:
        assert rollout.status is RolloutStatus.OK


@given(episodes(drift=True))
def test_raise_policy_raises_exactly_on_drift(episode: Episode) -> None:
    """Under RAISE, parsing raises DriftError if and only if some turn drifts."""
    if episode.drift_turns:
        with pytest.raises(DriftError) as info:
            parse_agent_response(episode.response, EOS, on_drift=DriftPolicy.RAISE)
        assert f"model turn {min(episode.drift_turns)}" in str(info.value)
    else:
        rollout = parse_agent_response(episode.response, EOS, on_drift=DriftPolicy.RAISE)
        assert rollout.status is RolloutStatus.OK


@given(episodes(drift=True), st.integers(1, 40), st.sampled_from(list(DriftPolicy)[1:]))
def test_truncation_cuts_all_arrays_together(
    episode: Episode, limit: int, policy: DriftPolicy
) -> None:
    """max_completion_length keeps a prefix of ids, mask and logprobs and flags the cut."""
    full = parse_agent_response(episode.response, EOS, on_drift=policy)
    cut = parse_agent_response(episode.response, EOS, on_drift=policy, max_completion_length=limit)
    for whole, part in zip(full.samples(), cut.samples(), strict=True):
        _assert_consistent(part)
        n = min(limit, len(whole.completion_ids))
        assert part.completion_ids.tolist() == whole.completion_ids[:n].tolist()
        assert part.env_mask.tolist() == whole.env_mask[:n].tolist()
        assert part.logprobs.tolist() == whole.logprobs[:n].tolist()
        assert part.truncated == (len(whole.completion_ids) > limit)


@given(episodes(drift=True), st.sampled_from(list(DriftPolicy)[1:]))
def test_bytes_and_dict_inputs_parse_identically(episode: Episode, policy: DriftPolicy) -> None:
    """The simdjson bytes path and the dict path give equal rollouts."""
    from_dict = parse_agent_response(episode.response, EOS, on_drift=policy)
    from_bytes = parse_agent_response(json.dumps(episode.response).encode(), EOS, on_drift=policy)
    assert from_bytes == from_dict


@given(json_values())
def test_arbitrary_json_never_raises(value: Any) -> None:
    """Any JSON-like value, as a dict or as bytes, parses to a consistent rollout."""
    for response in (value, json.dumps(value).encode()):
        rollout = parse_agent_response(response, EOS)
        _assert_consistent(rollout)
        assert math.isfinite(rollout.reward)


@given(mangled_responses())
def test_mangled_responses_never_raise(value: Any) -> None:
    """Valid episodes with random subtrees replaced by junk never crash the parser."""
    for response in (value, json.dumps(value).encode()):
        rollout = parse_agent_response(response, EOS, on_drift=DriftPolicy.FORK)
        for sample in rollout.samples():
            _assert_consistent(sample)
            assert math.isfinite(sample.reward)
        if rollout.status is not RolloutStatus.OK:
            assert rollout.error


@given(st.binary(max_size=200))
def test_arbitrary_bytes_never_raise(raw: bytes) -> None:
    """Any byte string parses to a rollout; non-JSON is INVALID."""
    rollout = parse_agent_response(raw, EOS)
    _assert_consistent(rollout)


@given(st.lists(rollouts(), min_size=1, max_size=6), st.integers(0, 5))
def test_collate_recovers_each_rollout_from_its_row(rollout_list: list[Rollout], pad: int) -> None:
    """Unpadding a batch row by its masks gives back the rollout, whatever the pad id."""
    batch = collate(rollout_list, pad_token_id=pad)
    assert len(batch) == len(rollout_list)
    for b, rollout in enumerate(rollout_list):
        prompt = batch.prompt_ids[b][batch.prompt_mask[b] == 1]
        assert prompt.tolist() == rollout.prompt_ids.tolist()
        real = batch.completion_mask[b] == 1
        assert int(real.sum()) == len(rollout.completion_ids)
        assert batch.completion_ids[b][real].tolist() == rollout.completion_ids.tolist()
        assert batch.env_mask[b][real].tolist() == rollout.env_mask.tolist()
        assert np.allclose(batch.logprobs[b][real], rollout.logprobs.astype(np.float32))
        assert np.all(batch.env_mask[b][~real] == 1)
        assert np.all(batch.logprobs[b][~real] == 0.0)
        assert batch.statuses[b] == rollout.status.value
        assert batch.ok[b] == rollout.ok
    assert np.array_equal(
        batch.loss_mask, batch.completion_mask * batch.env_mask * batch.ok[:, None]
    )
