"""Request bodies built from rows."""

from __future__ import annotations

from nemogym_sdk.wire import build_run_body


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
