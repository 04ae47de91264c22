"""Request bodies built from rows, /verify answers, and the names NeMo Gym spells."""

from __future__ import annotations

import json

import pytest

from nemogym_sdk.wire import (
    AGENTS,
    ENVIRONMENT_SERVERS,
    MODELS,
    RESOURCES,
    SERVER_TYPES,
    agent_name,
    build_run_body,
    decode_run_result,
    decode_server_instance,
    decode_verify_result,
    row_tools,
)


def test_run_body_precedence_and_no_nulls() -> None:
    """Caller overrides win, None overrides keep the row's value, None values are dropped."""
    row = {
        "responses_create_params": {
            "input": [{"role": "user", "content": "x"}],
            "temperature": 0.2,
            "top_p": 0.5,
            "max_output_tokens": None,
        },
        "agent_ref": {"name": "a"},
        "expected_answer": "42",
    }
    body = build_run_body(row, {"temperature": 1.0, "top_p": None, "max_output_tokens": 64})
    assert body["responses_create_params"] == {
        "input": [{"role": "user", "content": "x"}],
        "temperature": 1.0,
        "top_p": 0.5,
        "max_output_tokens": 64,
    }
    assert body["expected_answer"] == "42" and body["agent_ref"] == {"name": "a"}
    # the row itself is untouched
    assert row["responses_create_params"]["temperature"] == 0.2
    assert "max_output_tokens" in row["responses_create_params"]


def test_input_messages_of_a_row() -> None:
    """The prompt a trainer shows: string input, text parts joined, non-message items out."""
    from nemogym_sdk.wire import input_messages

    assert input_messages({"responses_create_params": {"input": "hi"}}) == [
        {"role": "user", "content": "hi"}
    ]
    row = {
        "responses_create_params": {
            "input": [
                {"role": "system", "content": "Be brief."},
                {
                    "type": "message",
                    "role": "user",
                    "content": [
                        {"type": "input_text", "text": "a"},
                        {"type": "input_image", "image_url": "x"},
                        {"type": "input_text", "text": "b"},
                    ],
                },
                {"type": "function_call", "name": "f", "arguments": "{}", "call_id": "1"},
                {"type": "function_call_output", "call_id": "1", "output": "{}"},
                "garbage",
            ]
        }
    }
    assert input_messages(row) == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "ab"},
    ]
    assert input_messages({}) == []
    assert input_messages({"responses_create_params": {"input": 3}}) == []


# --- /verify answers: one decoding, the same rules as /run results -------------------------


def test_verify_answer_keeps_finite_numeric_components_like_run_results() -> None:
    """``reward_components`` drops non-finite and non-numeric entries in /verify answers
    exactly as in /run results (NaN and Infinity are valid in Python's JSON)."""
    body = (
        b'{"reward": 0.5, "mask_sample": true, "reward_components": '
        b'{"ok": 1, "nan": NaN, "inf": Infinity, "flag": true, "text": "x"}}'
    )
    answer = decode_verify_result(body)
    assert answer.invalid is None and answer.reward == 0.5 and answer.mask_sample
    assert answer.reward_components == {"ok": 1.0}
    run = decode_run_result(json.loads(body))
    assert run.reward_components == answer.reward_components


@pytest.mark.parametrize(
    "body",
    [b"not json", b"[1, 2]", b"{}", b'{"reward": true}', b'{"reward": NaN}', b'{"reward": "1"}'],
)
def test_verify_answer_without_a_finite_reward_is_invalid(body: bytes) -> None:
    """No JSON, no object, no reward, a bool, a NaN or a string: invalid, never a crash."""
    answer = decode_verify_result(body)
    assert answer.invalid is not None and answer.reward is None


def test_row_helpers_read_agent_ref_and_tools() -> None:
    """``agent_name`` and ``row_tools`` read the row's NeMo Gym fields, tolerating junk."""
    tools = [{"type": "function", "name": "f"}]
    row = {"agent_ref": {"name": "a"}, "responses_create_params": {"input": "x", "tools": tools}}
    assert agent_name(row) == "a" and row_tools(row) == tools
    assert agent_name({"agent_ref": {"name": ""}}) is None
    assert agent_name({"agent_ref": "a"}) is None and row_tools({}) == []
    assert row_tools({"responses_create_params": {"tools": "nope"}}) == []


def test_server_instance_entries_decode_or_are_left_out() -> None:
    """A ``/server_instances`` entry needs a name, a host and an integer port."""
    entry = {
        "process_name": "p",
        "server_type": AGENTS,
        "name": "simple_agent",
        "host": "0.0.0.0",
        "port": 8001,
    }
    instance = decode_server_instance(entry)
    assert instance is not None
    assert (instance.name, instance.server_type, instance.implementation) == (
        "p",
        AGENTS,
        "simple_agent",
    )
    assert (instance.host, instance.port) == ("0.0.0.0", 8001)
    assert decode_server_instance({**entry, "port": "8001"}) is None
    assert decode_server_instance("p") is None


def test_server_type_names_are_shared() -> None:
    """``directory`` and ``gym`` use the one spelling of the server types in ``wire``."""
    from nemogym_sdk import directory
    from nemogym_sdk.gym import specs

    assert SERVER_TYPES == (AGENTS, RESOURCES, MODELS, ENVIRONMENT_SERVERS)
    assert directory.AGENTS is specs.AGENTS is AGENTS
    assert directory.RESOURCES is specs.RESOURCES is RESOURCES
    assert directory.MODELS is specs.MODELS is MODELS
    assert directory.ENVIRONMENTS is specs.ENVIRONMENT_SERVERS is ENVIRONMENT_SERVERS
