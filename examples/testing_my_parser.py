"""Testing a trainer's NeMo Gym glue with nemogym_sdk.testing (a pytest module).

A trainer integration turns NeMo Gym ``/run`` results into its own training samples;
here ``to_trainer_samples`` maps them to TRL-style dicts (``prompt_ids``,
``completion_ids``, ``env_mask``, ``logprobs``, ``reward``), drops failed rollouts and
keeps the forks of drifted ones. The tests below are what a parser author writes:

1. every ready-made property check, through a short adapter for the output shape;
2. a property of one's own over generated episodes and their ground truth;
3. the rollout collection against the fake NeMo Gym agent, with injected faults.

Run it::

    pip install '.[testing]'   # in a checkout of nemogym_sdk
    pytest examples/testing_my_parser.py
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hypothesis import given

from nemogym_sdk import AgentClient, DriftPolicy, RetryPolicy, parse_agent_response
from nemogym_sdk.testing import (
    Episode,
    FakeAgent,
    Fault,
    Parser,
    Sample,
    always,
    burst,
    check_all,
    episodes,
)

pytest_plugins = ["nemogym_sdk.testing.pytest_plugin"]  # the nemo_gym_agent fixture

EOS = 2


# --- the code under test: a trainer's conversion of /run results ------------------------------


def to_trainer_samples(response: Any) -> list[dict[str, Any]]:
    """TRL-style sample dicts of one ``/run`` result: none when it failed, one per
    drift-free part of the episode when its history drifted."""
    rollout = parse_agent_response(response, EOS, on_drift=DriftPolicy.FORK)
    return [sample.to_dict() for sample in rollout.samples() if sample.ok]


# --- 1. the kit's checks, through an adapter for this output shape ---------------------------


def as_samples(output: list[dict[str, Any]]) -> list[Sample]:
    """The adapter: what the trainer would train on, as ``Sample`` records."""
    return [
        Sample(
            prompt_ids=tuple(d["prompt_ids"]),
            completion_ids=tuple(d["completion_ids"]),
            train_mask=tuple(d["env_mask"]),
            logprobs=tuple(d["logprobs"]),
            reward=d["reward"],
            num_turns=d["num_turns"],
        )
        for d in output
    ]


def test_every_property_check() -> None:
    """The ground truth (tokens, masks, logprobs, reward, turns), drift, failure shapes
    and crash-freedom, each check on its own."""
    check_all(Parser(parse=to_trainer_samples, samples=as_samples, takes_bytes=True))


# --- 2. a property of one's own over the ground truth -----------------------------------------


@given(episodes(max_turns=4))
def test_a_well_formed_episode_is_one_sample(episode: Episode) -> None:
    """A contiguous episode gives exactly the sample its ground truth says."""
    (sample,) = to_trainer_samples(episode.response)
    expected = episode.expected_sample()
    assert {k: sample[k] for k in expected} == expected
    assert sample["reward"] == episode.reward


# --- 3. rollout collection against the fake agent, with faults --------------------------------

SINGLE_TURN = {
    "response": {
        "output": [
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "done", "annotations": []}],
                "prompt_token_ids": [1, 2, 3],
                "generation_token_ids": [7, 8],
                "generation_log_probs": [-0.5, -0.25],
            }
        ]
    },
    "reward": 1.0,
}


def collect(agent_url: str, rows: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """The trainer's rollout step: play every row, convert each result."""
    retry = RetryPolicy(max_attempts=3, base_delay=0.001, max_delay=0.01)
    with AgentClient({"agent": agent_url}, retry=retry) as client:
        raws = client.run_raw_sync(rows)
    return [[] if raw.body is None else to_trainer_samples(raw.body) for raw in raws]


def test_collection_survives_faults(nemo_gym_agent: Callable[..., FakeAgent]) -> None:
    """A 503 is retried; a row whose agent always resets yields no sample, not a crash."""
    agent = nemo_gym_agent(
        [SINGLE_TURN], {"t0": burst(Fault.HTTP_503, 1), "t1": always(Fault.RESET)}
    )
    rows = [{"task_id": f"t{i}", "responses_create_params": {"input": "hi"}} for i in range(3)]
    collected = collect(agent.url, rows)
    assert [len(samples) for samples in collected] == [1, 0, 1]
    assert collected[0][0]["completion_ids"] == [7, 8]
    assert (agent.attempts("t0"), agent.attempts("t1"), agent.attempts("t2")) == (2, 3, 1)
