"""Turn parser cases with tiny integer tokens, drawn in each docstring."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from nemogym_sdk import (
    ConfigError,
    DriftError,
    DriftPolicy,
    RolloutStatus,
    parse_agent_response,
)

EOS = 2


def turn(prompt: list[int], gen: list[int], lps: list[float] | None = None) -> dict[str, Any]:
    """A function_call output item carrying a model turn's token trio."""
    return {
        "type": "function_call",
        "name": "tool",
        "arguments": "{}",
        "prompt_token_ids": prompt,
        "generation_token_ids": gen,
        "generation_log_probs": lps if lps is not None else [-0.5] * len(gen),
    }


def tool_output() -> dict[str, Any]:
    return {"type": "function_call_output", "call_id": "c", "output": "{}"}


def run(*items: dict[str, Any], reward: float = 1.0, **extra: Any) -> dict[str, Any]:
    return {"response": {"output": list(items)}, "reward": reward, **extra}


THREE_TURNS = run(
    turn([1, 2], [10, 11], [-0.1, -0.2]),
    tool_output(),
    turn([1, 2, 10, 11, 50], [20], [-0.3]),
    tool_output(),
    turn([1, 2, 10, 11, 50, 20, 60, 61], [30, 31], [-0.4, -0.5]),
)


def test_three_turns_interleave_model_and_environment_tokens() -> None:
    """Three turns with one and two environment tokens between them.

    turn 0  prompt [1 2]                       gen [10 11]
    turn 1  prompt [1 2 10 11 50]              gen [20]
    turn 2  prompt [1 2 10 11 50 20 60 61]     gen [30 31]
    completion [10 11 50 20 60 61 30 31], mask [1 1 0 1 0 0 1 1]
    """
    rollout = parse_agent_response(THREE_TURNS, EOS)
    assert rollout.status is RolloutStatus.OK
    assert rollout.prompt_ids.tolist() == [1, 2]
    assert rollout.completion_ids.tolist() == [10, 11, 50, 20, 60, 61, 30, 31]
    assert rollout.env_mask.tolist() == [1, 1, 0, 1, 0, 0, 1, 1]
    assert rollout.logprobs.tolist() == [-0.1, -0.2, 0.0, -0.3, 0.0, 0.0, -0.4, -0.5]
    assert rollout.num_turns == 3
    assert int(rollout.env_mask.sum()) == 5  # = number of generated tokens


def test_turn_without_new_environment_tokens() -> None:
    """A prompt that is exactly the history adds no environment tokens.

    turn 0  prompt [1 2]        gen [10]
    turn 1  prompt [1 2 10]     gen [20]
    completion [10 20], mask [1 1]
    """
    rollout = parse_agent_response(run(turn([1, 2], [10]), turn([1, 2, 10], [20])), EOS)
    assert rollout.completion_ids.tolist() == [10, 20]
    assert rollout.env_mask.tolist() == [1, 1]


DRIFTED = run(
    turn([1, 2], [10, 11], [-0.1, -0.2]),
    tool_output(),
    turn([1, 2, 10, 99, 50], [20], [-0.3]),
    tool_output(),
    turn([1, 2, 10, 99, 50, 20, 60], [30], [-0.4]),
)
"""turn 1 re-rendered the history: [1 2 10 11] became [1 2 10 99]; turn 2 extends turn 1."""


def test_drift_mark_keeps_prefix_and_reports() -> None:
    """MARK: the rollout is DRIFT, keeps turn 0 only, and says where the history broke.

    history [1 2 10 11]   turn 1 prompt [1 2 10 99 50]   common prefix 3
    """
    rollout = parse_agent_response(DRIFTED, EOS, on_drift=DriftPolicy.MARK)
    assert rollout.status is RolloutStatus.DRIFT
    assert rollout.completion_ids.tolist() == [10, 11]
    assert rollout.env_mask.tolist() == [1, 1]
    assert rollout.reward == 1.0
    assert rollout.drift is not None
    assert (rollout.drift.turn_index, rollout.drift.output_index) == (1, 2)
    assert rollout.drift.common_prefix == 3
    assert rollout.drift.history_length == 4
    assert rollout.drift.prompt_length == 5
    assert "shares only 3 leading tokens" in rollout.error


def test_drift_fork_starts_a_new_sample_at_the_drift() -> None:
    """FORK: sample 0 is turn 0; sample 1 starts at turn 1's prompt and keeps turn 2.

    sample 0  prompt [1 2]             completion [10 11]          mask [1 1]
    sample 1  prompt [1 2 10 99 50]    completion [20 60 30]       mask [1 0 1]
    """
    rollout = parse_agent_response(DRIFTED, EOS, on_drift=DriftPolicy.FORK)
    assert rollout.status is RolloutStatus.OK
    assert [s.completion_ids.tolist() for s in rollout.samples()] == [[10, 11], [20, 60, 30]]
    assert [s.env_mask.tolist() for s in rollout.samples()] == [[1, 1], [1, 0, 1]]
    (fork,) = rollout.forks
    assert fork.prompt_ids.tolist() == [1, 2, 10, 99, 50]
    assert fork.logprobs.tolist() == [-0.3, 0.0, -0.4]
    assert fork.reward == rollout.reward == 1.0
    assert fork.drift is not None and fork.drift.turn_index == 1
    assert (rollout.num_turns, fork.num_turns) == (1, 2)


def test_drift_raise() -> None:
    """RAISE: DriftError carries the report, with decoded text when decode is given."""
    with pytest.raises(DriftError) as info:
        parse_agent_response(
            DRIFTED, EOS, on_drift="raise", decode=lambda ids: "|".join(map(str, ids))
        )
    assert "model turn 1 (output item 2)" in str(info.value)
    assert "'1|2|10|11'" in info.value.report
    assert isinstance(info.value, ValueError)


def test_shorter_prompt_is_drift_not_silence() -> None:
    """A prompt shorter than the history is a drift (the seed silently inserted nothing).

    history [1 2 10 11]   turn 1 prompt [1 2]
    """
    rollout = parse_agent_response(run(turn([1, 2], [10, 11]), turn([1, 2], [20])), EOS)
    assert rollout.status is RolloutStatus.DRIFT


def test_logprob_count_mismatch_is_invalid_never_padded() -> None:
    """Three tokens with two logprobs is INVALID with the seed's one-token shape."""
    rollout = parse_agent_response(run(turn([1], [10, 11, 12], [-0.1, -0.2]), reward=0.5), EOS)
    assert rollout.status is RolloutStatus.INVALID
    assert rollout.completion_ids.tolist() == [EOS]
    assert rollout.error == (
        "model turn 0 (output item 0): 2 generation_log_probs for 3 generation_token_ids"
    )


@pytest.mark.parametrize(
    ("response", "status", "reward"),
    [
        pytest.param({}, RolloutStatus.EMPTY, 0.0, id="empty-dict"),
        pytest.param({"error": "boom", "reward": 1.0}, RolloutStatus.AGENT_ERROR, 0.0, id="error"),
        pytest.param([1, 2], RolloutStatus.INVALID, 0.0, id="not-an-object"),
        pytest.param(
            {"response": {"output": []}, "reward": 0.4}, RolloutStatus.EMPTY, 0.4, id="no-output"
        ),
        pytest.param(
            run(
                {"type": "message", "content": [{"type": "output_text", "text": "  "}]}, reward=0.3
            ),
            RolloutStatus.EMPTY,
            0.3,
            id="blank-text",
        ),
        pytest.param(
            run({"type": "function_call", "name": "f", "arguments": "{}"}, reward=0.9),
            RolloutStatus.NO_TOKEN_IDS,
            0.0,
            id="no-token-ids",
        ),
        pytest.param(
            {"response": {"output": {}}, "reward": 1},
            RolloutStatus.INVALID,
            1.0,
            id="output-not-list",
        ),
        pytest.param(
            run(turn([1], [10]), reward=None), RolloutStatus.INVALID, 0.0, id="null-reward"
        ),
        pytest.param(
            run(turn([1], [10]), reward="1"), RolloutStatus.INVALID, 0.0, id="string-reward"
        ),
        pytest.param(run(turn([], [10])), RolloutStatus.INVALID, 1.0, id="empty-prompt"),
        pytest.param(run(turn([1, True], [10])), RolloutStatus.INVALID, 1.0, id="bool-token"),
        pytest.param(run(turn([1], [10.5])), RolloutStatus.INVALID, 1.0, id="float-token"),
        pytest.param(run(turn([1], [[10]])), RolloutStatus.INVALID, 1.0, id="nested-token"),
        pytest.param(run(turn([1], [10], ["x"])), RolloutStatus.INVALID, 1.0, id="str-logprob"),
        pytest.param(run(turn([1], [10], [True])), RolloutStatus.INVALID, 1.0, id="bool-logprob"),
    ],
)
def test_failures_keep_seed_defaults_with_a_status(
    response: Any, status: RolloutStatus, reward: float
) -> None:
    """Each failure is a one-token [eos] rollout, with a typed status and a reason."""
    for form in (response, json.dumps(response).encode()):
        rollout = parse_agent_response(form, EOS)
        assert rollout.status is status
        assert rollout.to_dict() == {
            "prompt_ids": [EOS],
            "completion_ids": [EOS],
            "env_mask": [0],
            "logprobs": [0.0],
            "reward": reward,
            "num_turns": 0,
        }
        assert rollout.error


def test_non_finite_logprob_is_invalid() -> None:
    """A NaN logprob is INVALID in a dict; as bytes, NaN is not JSON at all."""
    response = run(turn([1], [10], [float("nan")]))
    assert parse_agent_response(response, EOS).status is RolloutStatus.INVALID
    as_bytes = parse_agent_response(json.dumps(response).encode(), EOS)
    assert as_bytes.status is RolloutStatus.INVALID
    assert as_bytes.error is not None and "not valid JSON" in as_bytes.error


def test_empty_error_field_still_explains_itself() -> None:
    """An agent error with an empty message gets a reason (found by the fuzz profile)."""
    rollout = parse_agent_response({"error": ""}, EOS)
    assert rollout.status is RolloutStatus.AGENT_ERROR
    assert rollout.error == "the agent returned an empty error ('')"


def test_invalid_json_bytes() -> None:
    """Truncated JSON bytes are INVALID, not an exception."""
    rollout = parse_agent_response(b'{"response": {"output": [', EOS)
    assert rollout.status is RolloutStatus.INVALID
    assert rollout.error is not None and "not valid JSON" in rollout.error


def test_mask_sample_is_masked_with_tokens_kept() -> None:
    """mask_sample: true keeps the tokens and reward but the status is MASKED."""
    rollout = parse_agent_response(run(turn([1], [10]), reward=0.7, mask_sample=True), EOS)
    assert rollout.status is RolloutStatus.MASKED
    assert rollout.completion_ids.tolist() == [10]
    assert rollout.reward == 0.7
    assert not rollout.ok


def test_reward_components_are_kept() -> None:
    """Numeric reward_components survive; junk entries are dropped."""
    response = run(turn([1], [10]), reward=1.5, reward_components={"a": 1.0, "b": 0.5, "c": "x"})
    rollout = parse_agent_response(response, EOS)
    assert rollout.reward_components == {"a": 1.0, "b": 0.5}


def test_truncation_flags_and_cuts() -> None:
    """max_completion_length 4 cuts [10 11 50 20 60 61 30 31] to [10 11 50 20]."""
    rollout = parse_agent_response(THREE_TURNS, EOS, max_completion_length=4)
    assert rollout.truncated
    assert rollout.completion_ids.tolist() == [10, 11, 50, 20]
    assert rollout.env_mask.tolist() == [1, 1, 0, 1]
    assert rollout.logprobs.tolist() == [-0.1, -0.2, 0.0, -0.3]
    assert not parse_agent_response(THREE_TURNS, EOS, max_completion_length=8).truncated


def test_items_without_token_ids_are_skipped() -> None:
    """Reasoning items and messages without ids between turns do not count as turns."""
    response = run(
        {"type": "reasoning", "summary": []},
        turn([1], [10]),
        {"type": "message", "content": [{"type": "output_text", "text": "hi"}]},
        {"type": "message", "generation_token_ids": []},
        turn([1, 10, 5], [20]),
    )
    rollout = parse_agent_response(response, EOS)
    assert rollout.num_turns == 2
    assert rollout.completion_ids.tolist() == [10, 5, 20]


def test_arrays_are_read_only() -> None:
    """Rollout arrays cannot be modified in place (records are immutable)."""
    rollout = parse_agent_response(THREE_TURNS, EOS)
    with pytest.raises(ValueError, match="read-only"):
        rollout.completion_ids[0] = 5
    assert isinstance(rollout.logprobs, np.ndarray)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"on_drift": "ignore"},
        {"max_completion_length": 0},
        {"row_id": 7},
        {"repeat_index": -1},
        {"repeat_index": True},
    ],
)
def test_bad_arguments_raise_config_error(kwargs: dict[str, Any]) -> None:
    """Invalid arguments (not invalid responses) raise ConfigError."""
    with pytest.raises(ConfigError):
        parse_agent_response(THREE_TURNS, EOS, **kwargs)


def test_bad_eos_raises_config_error() -> None:
    """A non-integer eos id is a programming error."""
    with pytest.raises(ConfigError, match="eos_token_id"):
        parse_agent_response(THREE_TURNS, "2")  # type: ignore[arg-type]


def test_row_id_and_repeat_index_are_stamped_on_every_sample() -> None:
    """A hand-parsed result gets its identity from the call: the rollout, its fork (FORK
    policy on DRIFTED) and a failure alike; without the keywords both stay None."""
    forked = parse_agent_response(
        DRIFTED, EOS, on_drift=DriftPolicy.FORK, row_id="data.jsonl:3", repeat_index=1
    )
    assert len(forked.samples()) == 2
    assert {(s.row_id, s.repeat_index) for s in forked.samples()} == {("data.jsonl:3", 1)}
    failed = parse_agent_response({"error": "boom"}, EOS, row_id="data.jsonl:3", repeat_index=2)
    assert failed.status is RolloutStatus.AGENT_ERROR
    assert (failed.row_id, failed.repeat_index) == ("data.jsonl:3", 2)
    plain = parse_agent_response(THREE_TURNS, EOS)
    assert (plain.row_id, plain.repeat_index) == (None, None)
    repeat = parse_agent_response(THREE_TURNS, EOS, row_id="r", repeat_index=np.int64(4))
    assert type(repeat.repeat_index) is int and repeat.repeat_index == 4


@pytest.mark.parametrize(
    ("row", "status", "reason"),
    [
        (
            {
                "_ng_failure_class": "agent_run_error",
                "_ng_failure_type": "ClientResponseError",
                "_ng_failure_message": "500, message='Internal Server Error'",
                "_ng_failure_http_status": 500,
                "_ng_failure_response_body": "ValueError(no tool named search)",
            },
            RolloutStatus.AGENT_ERROR,
            "NeMo Gym agent_run_error (HTTP 500, ClientResponseError): 500, message='Internal "
            "Server Error'; body: ValueError(no tool named search)",
        ),
        (
            {"_ng_failure_class": "agent_request_failed", "_ng_failure_message": "reset"},
            RolloutStatus.TRANSPORT_ERROR,
            "NeMo Gym agent_request_failed: reset",
        ),
        (
            {
                "_ng_task_id": 3,
                "_ng_failure_class": "environment_server_failed",
                "_ng_failure_terminal": True,
                "_ng_failure_message": "the sandbox crashed",
                "_ng_failure_stage": "verification",
            },
            RolloutStatus.AGENT_ERROR,
            "NeMo Gym environment_server_failed (stage verification, terminal): the sandbox "
            "crashed",
        ),
        (
            {
                "_ng_failure_class": "cancelled",
                "_ng_no_persist": True,
                "_ng_dispatch_drained": True,
                "error_message": "not dispatched: dispatch budget exhausted",
            },
            RolloutStatus.TIMEOUT,
            "NeMo Gym cancelled: not dispatched: dispatch budget exhausted",
        ),
        ({"_ng_failure_class": "judge:odd"}, RolloutStatus.AGENT_ERROR, "NeMo Gym judge:odd"),
    ],
)
def test_nemo_gyms_failure_rows_are_typed_failures_with_its_reason(
    row: dict[str, Any], status: RolloutStatus, reason: str
) -> None:
    """A failure row of NeMo Gym's rollout collection (``route_failures_to_sidecar``, a
    drained dispatch, an environment server's failure) holds no ``/run`` result: it parses
    as a failure typed by its class, carrying NeMo Gym's reason, never as ``empty``."""
    for given in (row, json.dumps(row)):
        rollout = parse_agent_response(given, eos_token_id=EOS)
        assert (rollout.status, rollout.error) == (status, reason)
        assert rollout.completion_ids.tolist() == [EOS] and rollout.reward == 0.0
