"""The on-policy prefix splice and message normalisation (pure functions, no model)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nemogym_sdk.serve.chat import (
    SpliceError,
    build_prompt_ids,
    count_assistant_turns,
    developer_as_system,
    last_tokenized_assistant,
    normalize_messages,
    splice_prefix,
)
from nemogym_sdk.serve.errors import BadRequestError

E = 99  # EOS in the hand-drawn examples
START, EOS = 257, 258  # the fake ChatML renderer's special tokens


def chatml(
    messages: Sequence[Mapping[str, Any]],
    /,
    *,
    add_generation_prompt: bool,
    continue_final_message: bool,
) -> list[int]:
    """A byte-level ChatML renderer: <start> role \\n content <eos> \\n per message."""
    ids: list[int] = []
    for message in messages:
        text = message.get("content") or ""
        for call in message.get("tool_calls") or []:
            text += json.dumps(call["function"])
        ids += [START, *f"{message['role']}\n".encode(), *text.encode(), EOS, *b"\n"]
    if add_generation_prompt:
        ids += [START, *b"assistant\n"]
    return ids


def test_splice_replaces_the_rerendered_turn_with_the_model_tokens() -> None:
    """Tokens: prompt 1 2 9 | generation 5 6 E; template re-renders the turn as 7 E, adds 3 4 4.

    model_prefix    = [1, 2, 9, 5, 6, E]
    template_prefix = [1, 2, 9, 7, E, 3]
    template_ids    = [1, 2, 9, 7, E, 3, 4, 4]
    spliced         = [1, 2, 9, 5, 6, E, 3, 4, 4]
    """
    spliced = splice_prefix([1, 2, 9, 5, 6, E], [1, 2, 9, 7, E, 3], [1, 2, 9, 7, E, 3, 4, 4], {E})
    assert spliced == [1, 2, 9, 5, 6, E, 3, 4, 4]


def test_splice_keeps_a_length_cut_generation_and_adds_the_template_eos() -> None:
    """Generation cut before EOS: prompt 1 2 | generation 5 6; the template's E closes the turn.

    model_prefix    = [1, 2, 5, 6]
    template_prefix = [1, 2, 5, E, 3]
    template_ids    = [1, 2, 5, E, 3, 4]
    spliced         = [1, 2, 5, 6, E, 3, 4]
    """
    assert splice_prefix([1, 2, 5, 6], [1, 2, 5, E, 3], [1, 2, 5, E, 3, 4], {E}) == [
        1,
        2,
        5,
        6,
        E,
        3,
        4,
    ]


def test_splice_keeps_the_eos_the_model_emitted_when_several_are_accepted() -> None:
    """Two EOS ids (98, E): the model ended on 98, the template on E; 98 is kept, E dropped."""
    assert splice_prefix([1, 5, 98], [1, 7, E], [1, 7, E, 3], {98, E}) == [1, 5, 98, 3]


def test_splice_finds_the_turn_by_its_eos_where_the_template_dropped_its_reasoning() -> None:
    """A new user turn made the template drop the assistant turn's reasoning (8 8 8), so the
    request renders the history shorter than the prefix did; the turn still ends at the
    first EOS, not at the user's EOS that now sits where the prefix's ended.

    model_prefix    = [1, 8, 8, 8, 6, E]
    template_prefix = [1, 8, 8, 8, 6, E, 3]      (the turn ends at EOS number 1)
    template_ids    = [1, 6, E, 3, 2, 2, E, 3, 4]
    spliced         = [1, 8, 8, 8, 6, E, 3, 2, 2, E, 3, 4]
    """
    prefix = [1, 8, 8, 8, 6, E]
    spliced = splice_prefix(prefix, [*prefix, 3], [1, 6, E, 3, 2, 2, E, 3, 4], {E})
    assert spliced == [*prefix, 3, 2, 2, E, 3, 4]


def test_splice_without_model_prefix_is_the_template() -> None:
    """An empty model prefix leaves the template rendering untouched."""
    assert splice_prefix([], [1, E], [1, E, 3], {E}) == [1, E, 3]


def test_splice_errors_are_bad_requests() -> None:
    """No EOS in the history, or a rendering that did not grow, is a 400 error."""
    with pytest.raises(SpliceError, match="no EOS"):
        splice_prefix([1, 5], [1, 7, 3], [1, 7, 3, 4], {E})
    with pytest.raises(SpliceError, match="did not grow"):
        splice_prefix([1, 5], [1, 7, E], [1, 7, E], {E})
    assert issubclass(SpliceError, BadRequestError)
    assert issubclass(SpliceError, ValueError)


def test_last_tokenized_assistant_and_validation() -> None:
    """The last assistant carrying token ids is found; half a pair or non-int ids are rejected."""
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b", "prompt_token_ids": [1], "generation_token_ids": [2]},
        {"role": "assistant", "content": "c"},
        {"role": "tool", "content": "d"},
    ]
    assert last_tokenized_assistant(messages) == 1
    assert last_tokenized_assistant(messages[:1]) is None
    assert count_assistant_turns(messages) == 2
    with pytest.raises(SpliceError, match="generation_token_ids"):
        last_tokenized_assistant([{"role": "assistant", "prompt_token_ids": [1]}])
    bad: list[dict[str, Any]] = [
        {"role": "user"},
        {"role": "assistant", "prompt_token_ids": [1], "generation_token_ids": ["x"]},
    ]
    with pytest.raises(SpliceError, match="integer token ids"):
        build_prompt_ids(bad, chatml, {EOS})


def test_normalize_messages_matches_what_vllm_hands_the_template() -> None:
    """Token fields are dropped, text parts joined by newlines, JSON arguments decoded."""
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "1", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}},
                {"id": "2", "type": "function", "function": {"name": "g", "arguments": "not json"}},
            ],
            "prompt_token_ids": [1],
            "generation_token_ids": [2],
            "generation_log_probs": [-0.5],
        },
    ]
    clean = normalize_messages(messages)
    assert clean[0]["content"] == "a\nb"
    assert set(clean[1]) == {"role", "content", "tool_calls"}
    assert clean[1]["tool_calls"][0]["function"]["arguments"] == {"x": 1}
    assert clean[1]["tool_calls"][1]["function"]["arguments"] == "not json"
    assert messages[1]["tool_calls"][0]["function"]["arguments"] == '{"x": 1}'  # input untouched


def test_build_prompt_ids_without_token_ids_is_the_plain_rendering() -> None:
    """No tokenized assistant message: the prompt is exactly the template rendering."""
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    expected = chatml(messages, add_generation_prompt=True, continue_final_message=False)
    assert build_prompt_ids(messages, chatml, {EOS}) == expected


_generation = st.tuples(
    st.lists(st.integers(min_value=0, max_value=START), max_size=12),  # any bytes, even <start>
    st.booleans(),  # ended on EOS (else cut by max_tokens)
    st.text(max_size=8),  # the tool's answer
)


@given(turns=st.lists(_generation, min_size=1, max_size=5), user=st.text(max_size=10))
def test_multi_turn_prompts_extend_the_previous_prompt_and_generation(
    turns: list[tuple[list[int], bool, str]], user: str
) -> None:
    """Each turn's prompt starts with the previous prompt + generation, whatever was generated."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": user},
    ]
    prompt = build_prompt_ids(messages, chatml, {EOS})
    for body, ended, tool_text in turns:
        generation = [*body, EOS] if ended else body
        text = bytes(t for t in body if t < 256).decode("utf-8", errors="replace")
        messages.append(
            {
                "role": "assistant",
                "content": text,
                "prompt_token_ids": prompt,
                "generation_token_ids": generation,
            }
        )
        messages.append({"role": "tool", "content": tool_text})
        next_prompt = build_prompt_ids(messages, chatml, {EOS})
        seen = prompt + generation
        assert next_prompt[: len(seen)] == seen
        tool_block = [START, *b"tool\n", *tool_text.encode(), EOS, *b"\n"]
        closing = [] if ended else [EOS]
        assert next_prompt[len(seen) :] == [*closing, *b"\n", *tool_block, START, *b"assistant\n"]
        prompt = next_prompt


@given(st.lists(st.text(max_size=6), min_size=1, max_size=4))
def test_splice_is_a_no_op_when_the_model_tokens_match_the_template(replies: list[str]) -> None:
    """If the generation re-renders token for token, the spliced prompt equals the plain one."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "q"}]
    for reply in replies:
        prompt = build_prompt_ids(messages, chatml, {EOS})
        generation = [*reply.encode(), EOS]
        messages.append(
            {
                "role": "assistant",
                "content": reply,
                "prompt_token_ids": prompt,
                "generation_token_ids": generation,
            }
        )
        messages.append({"role": "user", "content": "more"})
        plain = chatml(
            normalize_messages(messages), add_generation_prompt=True, continue_final_message=False
        )
        assert build_prompt_ids(messages, chatml, {EOS}) == plain


def test_a_developer_message_is_a_system_one_where_the_template_has_no_place_for_it() -> None:
    """As vLLM does: ``developer`` becomes ``system`` (tools dropped) and every system
    message merges into one at the front; a template that names the role keeps them."""
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hi"},
        {"role": "developer", "content": "Use tools.", "tools": [{"x": 1}]},
    ]
    assert developer_as_system(messages, "{{ messages }}") == [
        {"role": "system", "content": "Be brief.\n\nUse tools."},
        {"role": "user", "content": "hi"},
    ]
    assert developer_as_system(messages[2:], "{{ m }}") == [
        {"role": "system", "content": "Use tools."}
    ]
    named = "{% if m.role == 'developer' %}{% endif %}"
    assert developer_as_system(messages, named) == messages
    assert developer_as_system(messages[:2], "") == messages[:2]
