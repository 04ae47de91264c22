"""The kit's strategies: each one's ground truth, checked against our parser."""

from __future__ import annotations

import json

import pytest
from hypothesis import Phase, find, given, settings

from nemogym_sdk import DriftPolicy, RolloutStatus, parse_agent_response
from nemogym_sdk.testing import (
    Episode,
    FailureCase,
    drifted_episodes,
    episodes,
    failures,
    raw_responses,
)

pytestmark = pytest.mark.property

EOS = 2


@given(episodes(min_turns=2, max_turns=3, max_prompt=2, max_generation=1, max_env=0))
def test_episode_sizes_are_parameters(episode: Episode) -> None:
    """Turn counts and sizes stay within the bounds asked for; the ground truth matches."""
    assert 2 <= episode.num_turns <= 3
    assert 1 <= len(episode.prompts[0]) <= 2
    assert all(len(g) == 1 for g in episode.generations)
    expected = episode.expected_sample()
    assert expected["env_mask"] == [1] * episode.num_turns  # no environment tokens
    rollout = parse_agent_response(episode.response, EOS)
    assert {k: rollout.to_dict()[k] for k in expected} == expected


@given(drifted_episodes(max_turns=4))
def test_drifted_episodes_say_where_and_how_they_drift(episode: Episode) -> None:
    """Every drifted episode drifts; the first drift turn is where our parser sees it, and
    each drift kind describes the prompt it made."""
    assert episode.drift_turns and set(dict(episode.drift_kinds)) == episode.drift_turns
    rollout = parse_agent_response(episode.response, EOS, on_drift=DriftPolicy.MARK)
    assert rollout.status is RolloutStatus.DRIFT
    assert rollout.drift is not None and rollout.drift.turn_index == min(episode.drift_turns)
    for turn, kind in episode.drift_kinds:
        history, prompt = episode.history(turn), episode.prompts[turn]
        common = next(
            (i for i, (a, b) in enumerate(zip(history, prompt, strict=False)) if a != b),
            min(len(history), len(prompt)),
        )
        if kind == "retokenized":
            assert prompt[common] == history[common] + 1
        elif kind == "stripped":
            assert common < len(history)
        assert f"turn {turn}:" in episode.describe()


@given(failures())
def test_failure_shapes_carry_the_status_our_parser_gives(case: FailureCase) -> None:
    """Each failure shape parses to its stated status (from a dict and from bytes), in
    the seed's one-token shape unless the sample is only masked."""
    for response in (case.response, json.dumps(case.response).encode()):
        rollout = parse_agent_response(response, EOS)
        assert rollout.status is case.status, (case.kind, rollout.error)
        assert rollout.error
        if case.status is not RolloutStatus.MASKED:
            assert rollout.completion_ids.tolist() == [EOS]
    if case.kind == "logprob_count_mismatch":
        assert case.turn is not None
        sent = case.logprobs
        assert sent is None or len(sent) != len(case.episode.generations[case.turn])


@given(raw_responses())
def test_raw_responses_never_break_our_parser(raw: bytes) -> None:
    """Raw bodies (valid, truncated, noise) parse to a rollout; truncated JSON is INVALID."""
    rollout = parse_agent_response(raw, EOS, on_drift=DriftPolicy.FORK)
    assert len(rollout.env_mask) == len(rollout.completion_ids) == len(rollout.logprobs)
    try:
        json.loads(raw)
    except ValueError:
        assert rollout.status is RolloutStatus.INVALID


FIRST_FOUND = settings(phases=[Phase.generate], database=None)
"""A search that keeps the first example it finds: shrinking it would prove nothing more."""


def test_rewards_are_drawn_as_json_carries_them() -> None:
    """Episodes draw float rewards and integer ones (JSON ``1`` decodes to ``int``), and
    the response carries the reward as drawn."""
    for kind in (int, float):
        episode = find(
            episodes(),
            lambda e, kind=kind: type(e.reward) is kind and e.reward != 0,
            settings=FIRST_FOUND,
        )
        sent = json.loads(json.dumps(episode.response))["reward"]
        assert type(sent) is kind and sent == episode.reward


@given(drifted_episodes(drift_kinds=("stripped",), max_turns=4))
def test_drift_kinds_limit_how_an_episode_drifts(episode: Episode) -> None:
    """Only the asked-for kind drifts, and no turn before the first drift does."""
    assert {kind for _, kind in episode.drift_kinds} == {"stripped"}
    first = min(episode.drift_turns)
    for turn in range(1, first):
        assert episode.prompts[turn][: len(episode.history(turn))] == episode.history(turn)
