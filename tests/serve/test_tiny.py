"""The in-process tiny tokenizer, chat template and model."""

from __future__ import annotations

import concurrent.futures
import threading
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

pytest.importorskip("transformers")

import torch
from tokenizers.pre_tokenizers import ByteLevel

from nemogym_sdk.serve.backend import CausalLMBackend
from nemogym_sdk.serve.chat import normalize_messages
from nemogym_sdk.serve.tiny import (
    build_tiny_model,
    build_tiny_tokenizer,
    byte_to_unicode,
    save_tiny,
)
from nemogym_sdk.serve.tools import format_tool_call

from .conftest import WEATHER_TOOL

TOKENIZER = build_tiny_tokenizer()


def test_byte_alphabet_is_the_byte_level_alphabet() -> None:
    """256 distinct characters, exactly the ones the ByteLevel pre-tokenizer emits."""
    mapping = byte_to_unicode()
    assert sorted(mapping) == list(range(256))
    assert set(mapping.values()) == set(ByteLevel.alphabet())


def test_tokenizer_has_one_token_per_byte_and_four_specials() -> None:
    """Byte value = token id; specials are 256-259 and EOS is <|im_end|>."""
    assert len(TOKENIZER) == 260
    assert TOKENIZER.encode("hé", add_special_tokens=False) == [104, 195, 169]
    ids = TOKENIZER.convert_tokens_to_ids(
        ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|pad|>"]
    )
    assert ids == [256, 257, 258, 259]
    assert TOKENIZER.eos_token_id == 258 and TOKENIZER.pad_token_id == 259
    assert TOKENIZER.encode("a<|im_end|>", add_special_tokens=False) == [97, 258]


@given(st.text(max_size=40).filter(lambda s: "<|" not in s))
def test_tokenizer_round_trips_any_text(text: str) -> None:
    """Encoding then decoding gives the text back, one token per UTF-8 byte."""
    ids = TOKENIZER.encode(text, add_special_tokens=False)
    assert ids == list(text.encode("utf-8"))
    assert TOKENIZER.decode(ids) == text


def _render(messages: list[dict[str, Any]], **kwargs: Any) -> str:
    return str(
        TOKENIZER.apply_chat_template(normalize_messages(messages), tokenize=False, **kwargs)
    )


def test_template_renders_every_role_and_the_generation_prompt() -> None:
    """System, developer, user, assistant and tool messages each get an im_start/im_end block."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "S"},
        {"role": "developer", "content": "D"},
        {"role": "user", "content": [{"type": "text", "text": "U"}]},
        {"role": "assistant", "content": "A"},
        {"role": "tool", "tool_call_id": "1", "content": "T"},
    ]
    expected = (
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>developer\nD<|im_end|>\n"
        "<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\nA<|im_end|>\n"
        "<|im_start|>tool\nT<|im_end|>\n<|im_start|>assistant\n"
    )
    assert _render(messages, add_generation_prompt=True) == expected
    assert _render(messages, add_generation_prompt=False) == expected.removesuffix(
        "<|im_start|>assistant\n"
    )


def test_template_lists_tools_and_renders_tool_calls_like_the_model_writes_them() -> None:
    """The tools block names each tool; an assistant tool call renders as format_tool_call."""
    call = {
        "id": "c1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "SF"}'},
    }
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
    ]
    text = _render(messages, tools=[WEATHER_TOOL], add_generation_prompt=False)
    assert text.startswith("<|im_start|>system\n# Tools\n")
    assert '"name": "get_weather"' in text.split("</tools>")[0]
    turn = (
        "<|im_start|>assistant\n" + format_tool_call("get_weather", {"city": "SF"}) + "<|im_end|>\n"
    )
    assert text.endswith(turn)
    both: list[dict[str, Any]] = [
        {"role": "assistant", "content": "Checking.", "tool_calls": [call, call]}
    ]
    one = format_tool_call("get_weather", {"city": "SF"})
    assert f"Checking.\n{one}\n{one}<|im_end|>" in _render(both)


def test_model_weights_are_deterministic_in_the_seed() -> None:
    """Same seed, same weights; another seed, other weights; the global RNG is left alone."""
    state = torch.random.get_rng_state()
    first, again, other = build_tiny_model(1), build_tiny_model(1), build_tiny_model(2)
    assert torch.equal(torch.random.get_rng_state(), state)
    pairs = zip(first.parameters(), again.parameters(), strict=True)
    assert all(torch.equal(a, b) for a, b in pairs)
    assert not torch.equal(first.lm_head.weight, other.lm_head.weight)
    assert first.config.head_dim == 32 and first.config.vocab_size == 260


def test_models_built_on_threads_side_by_side_get_their_own_seeds_weights() -> None:
    """The trainer builds its policy on one thread while another saves the sampler's model:
    torch's RNG is the process's, so each build holds it (`seeded_rng`) and both get the
    weights their seed gives alone. Unlocked, threads drew from each other's seeds."""
    alone = {seed: build_tiny_model(seed).lm_head.weight for seed in (1, 2)}
    start = threading.Barrier(4)

    def build(seed: int) -> torch.Tensor:
        start.wait()
        return build_tiny_model(seed).lm_head.weight

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        for _ in range(3):
            seeds = [1, 2, 1, 2]
            built = list(pool.map(build, seeds))
            assert all(torch.equal(w, alone[s]) for w, s in zip(built, seeds, strict=True))


def test_saved_tiny_model_loads_by_path_with_identical_outputs(tmp_path: Path) -> None:
    """save_tiny writes a directory that from_pretrained serves with the same ids and logprobs."""
    directory = save_tiny(tmp_path / "tiny", seed=3)
    assert (directory / "config.json").is_file()
    loaded = CausalLMBackend.from_pretrained(directory)
    built = CausalLMBackend(build_tiny_model(3), build_tiny_tokenizer(), name_or_path="tiny")
    messages = [{"role": "user", "content": "hello"}]
    prompt = built.prompt_ids(messages, tools=[WEATHER_TOOL])
    assert loaded.prompt_ids(messages, tools=[WEATHER_TOOL]) == prompt
    forced = [*built.encode("Hi there"), 258]
    expected = [t.logprob for t in built.score(prompt, forced)]
    assert [t.logprob for t in loaded.score(prompt, forced)] == pytest.approx(expected, abs=1e-6)
    assert loaded.eos_token_ids == frozenset({258})
