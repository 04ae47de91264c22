"""The kit's checks on a real peer: axolotl 0.19.0's NeMo Gym parser, and on ours.

``docs/testing.md`` records these findings; every one is asserted here twice: the
property checks must find it (with the shrunk counterexample, which our parser must
handle), and a minimal hand-drawn counterexample pins the peer's exact output next to
what ``parse_agent_response`` does with the same input. If the peer's behaviour or the
kit changes, a test here fails.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from nemogym_sdk import DriftError, DriftPolicy, RolloutStatus, parse_agent_response
from nemogym_sdk.testing import (
    Episode,
    FailureCase,
    Parser,
    find_failures,
    sdk_parser,
)
from tests.testing.peer_axolotl import PEER_FILE, PEER_VERSION, load_peer_parser, peer_version
from tests.testing.profiles import QUICK

pytestmark = [
    pytest.mark.property,
    pytest.mark.skipif(
        not PEER_FILE.exists(),
        reason="axolotl is not installed in .venv-axolotl (make axolotl-venv)",
    ),
]

EOS = 2


@pytest.fixture(scope="module")
def peer() -> Any:
    assert peer_version() == PEER_VERSION, "the findings below are axolotl 0.19.0's"
    return load_peer_parser()


def run_result(*turns: tuple[list[int], list[int], list[float] | None], **extra: Any) -> dict:
    """A ``/run`` result of function-call model turns ``(prompt, generation, logprobs)``."""
    output = []
    for n, (prompt, generation, logprobs) in enumerate(turns):
        item: dict[str, Any] = {
            "type": "function_call",
            "call_id": f"c{n}",
            "name": "f",
            "arguments": "{}",
            "prompt_token_ids": prompt,
            "generation_token_ids": generation,
        }
        if logprobs is not None:
            item["generation_log_probs"] = logprobs
        output.append(item)
    return {"response": {"output": output}, "reward": 1.0} | extra


def seed(rollout: Any) -> dict[str, Any]:
    return {k: rollout.to_dict()[k] for k in ("prompt_ids", "completion_ids", "env_mask")}


# --- what the property checks find ----------------------------------------------------------


PEER_FINDINGS = [
    "logprob_count_mismatch_not_trained",
    "drift_rejected[retokenized]",
    "drift_rejected[stripped]",
    "drift_rejected[rerendered]",
    "failures_not_trained[mask_sample]",
    "failures_not_trained[invalid_reward]",
    "failures_not_trained[invalid_logprobs]",
    "failures_not_trained[invalid_token_ids]",
    "never_crashes[dicts]",
]
"""The checks the peer fails (``docs/testing.md``), in ``CHECKS`` order."""


def test_the_checks_find_the_peers_defects_and_none_in_ours(peer: Any) -> None:
    """The peer passes every ground-truth check (stitching, both masks, logprobs, reward,
    num_turns) and the agent-error, empty and missing-token-id shapes; it fails drift
    (every kind), the logprob count, four failure shapes and crash-freedom. Each shrunk
    counterexample is handled by our parser."""
    found = find_failures(Parser(parse=lambda r: peer(r, EOS), name="axolotl"), settings=QUICK)
    assert list(found) == PEER_FINDINGS

    for kind in ("retokenized", "stripped", "rerendered"):
        drift = found[f"drift_rejected[{kind}]"].counterexample
        assert isinstance(drift, Episode) and drift.num_turns == 2 and drift.drift_turns == {1}
        assert drift.drift_kinds == ((1, kind),)
        forked = parse_agent_response(drift.response, EOS, on_drift=DriftPolicy.FORK).samples()
        assert [s.status for s in forked] == [RolloutStatus.OK, RolloutStatus.OK]
        assert [seed(s) for s in forked] == [
            {k: drift.expected_sample([t])[k] for k in ("prompt_ids", "completion_ids", "env_mask")}
            for t in (0, 1)
        ]
        assert parse_agent_response(drift.response, EOS).status is RolloutStatus.DRIFT

    miscounted = found["logprob_count_mismatch_not_trained"].counterexample
    assert isinstance(miscounted, FailureCase) and miscounted.episode.num_turns == 1
    assert miscounted.turn == 0 and miscounted.kind == "logprob_count_mismatch"
    assert parse_agent_response(miscounted.response, EOS).status is RolloutStatus.INVALID

    for kind in ("mask_sample", "invalid_reward", "invalid_logprobs", "invalid_token_ids"):
        failure = found[f"failures_not_trained[{kind}]"].counterexample
        assert isinstance(failure, FailureCase) and failure.kind == kind
        assert parse_agent_response(failure.response, EOS).status is failure.status

    crash = found["never_crashes[dicts]"]
    assert "parsing raised" in crash.message and "input (decoded JSON): " in crash.message
    assert parse_agent_response(crash.counterexample, EOS).status is not RolloutStatus.OK

    assert find_failures(sdk_parser(DriftPolicy.MARK), settings=QUICK) == {}


# --- the same findings, as minimal drawn counterexamples -----------------------------------


def test_a_retokenized_history_is_stitched_silently(peer: Any) -> None:
    """Turn 1's prompt re-tokenized the history's first token (3 -> 5)::

        turn 0  prompt [3]      generation [4]
        turn 1  prompt [5 4 6]  generation [7]     history [3 4] is not a prefix

    The peer cuts turn 1's prompt at the history's length and trains 7 after [3 4 6], a
    context the model never saw. Ours: MARK -> DRIFT at turn 1, FORK -> two samples,
    RAISE -> DriftError."""
    response = run_result(([3], [4], [-0.5]), ([5, 4, 6], [7], [-0.25]))
    assert peer(response, EOS) == {
        "prompt_ids": [3],
        "completion_ids": [4, 6, 7],
        "env_mask": [1, 0, 1],
        "logprobs": [-0.5, 0.0, -0.25],
        "reward": 1.0,
        "num_turns": 2,
    }
    marked = parse_agent_response(response, EOS)
    assert marked.status is RolloutStatus.DRIFT
    assert marked.drift is not None and marked.drift.turn_index == 1
    forked = parse_agent_response(response, EOS, on_drift="fork").samples()
    assert [seed(s) for s in forked] == [
        {"prompt_ids": [3], "completion_ids": [4], "env_mask": [1]},
        {"prompt_ids": [5, 4, 6], "completion_ids": [7], "env_mask": [1]},
    ]
    with pytest.raises(DriftError, match="model turn 1"):
        parse_agent_response(response, EOS, on_drift="raise")


def test_a_stripped_history_loses_the_tool_output(peer: Any) -> None:
    """Turn 1's prompt dropped the previous generation (stripped reasoning)::

        turn 0  prompt [3]    generation [4]
        turn 1  prompt [3 6]  generation [7]       6 is the tool output

    The prompt is no longer than the history, so the peer adds no environment tokens:
    the tool output 6 disappears and 7 is trained right after 4. Ours: DRIFT."""
    response = run_result(([3], [4], [-0.5]), ([3, 6], [7], [-0.25]))
    out = peer(response, EOS)
    assert (out["completion_ids"], out["env_mask"]) == ([4, 7], [1, 1])
    assert parse_agent_response(response, EOS).status is RolloutStatus.DRIFT
    forked = parse_agent_response(response, EOS, on_drift="fork").samples()
    assert [seed(s) for s in forked][1] == {
        "prompt_ids": [3, 6],
        "completion_ids": [7],
        "env_mask": [1],
    }


@pytest.mark.parametrize(
    ("logprobs", "peer_logprobs"),
    [([-0.5], [-0.5, 0.0]), ([-0.5, -0.25, -0.125], [-0.5, -0.25]), (None, [0.0, 0.0])],
    ids=["short", "long", "absent"],
)
def test_a_logprob_count_mismatch_is_padded_or_cut(
    peer: Any, logprobs: list[float] | None, peer_logprobs: list[float]
) -> None:
    """Two generated tokens [4 5] with one, three or no logprobs: the peer pads with 0.0
    (probability 1) or cuts, and trains both tokens. Ours: INVALID, nothing trained."""
    response = run_result(([3], [4, 5], logprobs))
    out = peer(response, EOS)
    assert (out["env_mask"], out["logprobs"]) == ([1, 1], peer_logprobs)
    rollout = parse_agent_response(response, EOS)
    assert rollout.status is RolloutStatus.INVALID
    assert rollout.env_mask.tolist() == [0]


def test_mask_sample_is_trained(peer: Any) -> None:
    """``mask_sample: true`` (the environment asks to leave the sample out) is ignored by
    the peer: [4] is trained. Ours: MASKED, kept out of the loss and the baseline."""
    response = run_result(([3], [4], [-0.5]), mask_sample=True)
    assert peer(response, EOS)["env_mask"] == [1]
    assert parse_agent_response(response, EOS).status is RolloutStatus.MASKED


@pytest.mark.parametrize(
    ("response", "error", "status"),
    [
        ({"response": None, "reward": 0.0}, AttributeError, RolloutStatus.EMPTY),
        ({"response": {"output": [7]}, "reward": 0.0}, AttributeError, RolloutStatus.INVALID),
        (run_result(([3], [4], [-0.5]), reward="1.0?"), ValueError, RolloutStatus.INVALID),
        (run_result(([3], [4], [-0.5]), reward=None), TypeError, RolloutStatus.INVALID),
    ],
    ids=["response-null", "output-item-not-object", "reward-text", "reward-null"],
)
def test_malformed_results_crash_the_peer(
    peer: Any, response: dict[str, Any], error: type[Exception], status: RolloutStatus
) -> None:
    """Wrong types raise out of the peer's parser. Ours: a failed rollout (EMPTY for a
    null ``response``, INVALID otherwise) with the reason, no raise."""
    with pytest.raises(error):
        peer(response, EOS)
    rollout = parse_agent_response(response, EOS)
    assert rollout.status is status and rollout.error


def test_a_nan_reward_is_trained(peer: Any) -> None:
    """A NaN reward reaches the peer's trainable sample. Ours: INVALID."""
    out = peer(run_result(([3], [4], [-0.5]), reward=math.nan), EOS)
    assert math.isnan(out["reward"]) and out["env_mask"] == [1]
    status = parse_agent_response(run_result(([3], [4], [-0.5]), reward=math.nan), EOS).status
    assert status is RolloutStatus.INVALID


@pytest.mark.parametrize(
    ("turn", "field", "peer_value"),
    [
        (([3], [4], [math.nan]), "logprobs", [math.nan]),
        ((["3"], [4], [-0.5]), "prompt_ids", ["3"]),
        (([3], [4.5], [-0.5]), "completion_ids", [4.5]),
    ],
    ids=["nan-logprob", "string-token", "float-token"],
)
def test_entries_of_the_wrong_type_are_trained(
    peer: Any, turn: tuple[list[Any], list[Any], list[float]], field: str, peer_value: list[Any]
) -> None:
    """A NaN logprob, a token id sent as a string or as a float is copied into the
    peer's trainable sample as it came. Ours: INVALID, nothing trained."""
    out = peer(run_result(turn), EOS)
    assert out["env_mask"] == [1]
    assert repr(out[field]) == repr(peer_value)
    assert parse_agent_response(run_result(turn), EOS).status is RolloutStatus.INVALID


def test_an_agent_error_reads_as_reward_zero(peer: Any) -> None:
    """Not a check finding but its output shape: a failure is the one-token ``[eos]`` sample
    with reward 0.0 and nothing saying it failed, so a group baseline counts it as a real
    0. Ours: AGENT_ERROR, left out of the baseline."""
    response = {"error": "model server timed out", "response": {"output": []}, "reward": 1.0}
    assert peer(response, EOS) == {
        "prompt_ids": [EOS],
        "completion_ids": [EOS],
        "env_mask": [0],
        "logprobs": [0.0],
        "reward": 0.0,
        "num_turns": 0,
    }
    assert parse_agent_response(response, EOS).status is RolloutStatus.AGENT_ERROR
