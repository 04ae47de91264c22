"""``history``: a prompt continues the model's own tokens (``contiguous``, the default) or is
the chat template's rendering (``template``, as plain vLLM's), on generation and ``/tokenize``
alike; the CLI's ``--history`` sets it."""

from __future__ import annotations

from typing import Any

import pytest

from nemogym_sdk import DriftPolicy, parse_agent_response
from nemogym_sdk.errors import ConfigError

pytest.importorskip("transformers")

from nemogym_sdk.serve import CausalLMBackend, ServeEngine
from nemogym_sdk.serve.__main__ import build_parser

EOS = 258
GENERATION = [0xFF, 0x41, EOS]
"""Turn 1's tokens: a byte that is not UTF-8, so its text (U+FFFD A) renders back otherwise."""


@pytest.fixture(scope="module")
def backend() -> CausalLMBackend:
    return CausalLMBackend.tiny(0)


def conversation(backend: CausalLMBackend) -> tuple[list[int], list[dict[str, Any]]]:
    """Turn 1's prompt, and the messages of turn 2's request (turn 1 carries its tokens)."""
    first = [{"role": "user", "content": "hi"}]
    prompt = backend.render(
        first, tools=None, add_generation_prompt=True, continue_final_message=False
    )
    answer = {
        "role": "assistant",
        "content": backend.decode(GENERATION),
        "prompt_token_ids": prompt,
        "generation_token_ids": GENERATION,
    }
    return prompt, [*first, answer, {"role": "user", "content": "again"}]


def tokenized(engine: ServeEngine, messages: list[dict[str, Any]]) -> list[int]:
    return list(engine.tokenize({"messages": messages})["tokens"])


def test_contiguous_continues_the_models_tokens_and_template_renders(
    backend: CausalLMBackend,
) -> None:
    prompt, messages = conversation(backend)
    contiguous = tokenized(ServeEngine(backend, mode="sample"), messages)
    template = tokenized(ServeEngine(backend, mode="sample", history="template"), messages)
    assert contiguous[: len(prompt) + len(GENERATION)] == prompt + GENERATION
    rendered = backend.render(
        [{k: v for k, v in m.items() if "token" not in k} for m in messages],
        tools=None,
        add_generation_prompt=True,
        continue_final_message=False,
    )
    assert template == rendered and template[: len(prompt)] == prompt
    assert template[: len(prompt) + len(GENERATION)] != prompt + GENERATION


def test_a_template_history_parses_into_one_trace_per_prompt(backend: CausalLMBackend) -> None:
    """The two turns as NeMo Gym returns them under ``template``: parsed with FORK, each
    trace's prompt is the one its turn was sampled from, and each generated token is in
    exactly one trace, as a policy token."""
    prompt, messages = conversation(backend)
    second = tokenized(ServeEngine(backend, mode="sample", history="template"), messages)

    def turn(prompt_ids: list[int], generation: list[int]) -> dict[str, Any]:
        text = {"type": "output_text", "text": "a", "annotations": []}
        return {
            "type": "message",
            "role": "assistant",
            "content": [text],
            "prompt_token_ids": prompt_ids,
            "generation_token_ids": generation,
            "generation_log_probs": [-1.0] * len(generation),
        }

    result = {
        "response": {"output": [turn(prompt, GENERATION), turn(second, [0x42, EOS])]},
        "reward": 1.0,
    }
    episode = parse_agent_response(result, EOS, on_drift=DriftPolicy.FORK)
    traces = episode.samples()
    assert [list(t.prompt_ids) for t in traces] == [prompt, second]
    trained = [list(t.completion_ids[t.env_mask == 1]) for t in traces]
    assert trained == [GENERATION, [0x42, EOS]]


def test_history_is_checked_and_set_by_the_cli(backend: CausalLMBackend) -> None:
    with pytest.raises(ConfigError, match="history must be one of contiguous, template"):
        ServeEngine(backend, history="rendered")  # type: ignore[arg-type]
    assert build_parser().parse_args([]).history == "contiguous"
    assert build_parser().parse_args(["--history", "template"]).history == "template"
