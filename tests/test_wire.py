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
