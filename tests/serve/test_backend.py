"""The transformers backend: real logprobs for sampled and forced tokens, sampling controls."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

import torch

from nemogym_sdk.serve.backend import CausalLMBackend
from nemogym_sdk.serve.errors import BadRequestError
from nemogym_sdk.serve.protocol import RequestSampling

EOS = 258


@pytest.fixture(scope="module")
def backend() -> CausalLMBackend:
    """The tiny model, seed 0."""
    return CausalLMBackend.tiny(0)


@pytest.fixture(scope="module")
def prompt(backend: CausalLMBackend) -> list[int]:
    """A short chat prompt."""
    return backend.prompt_ids([{"role": "user", "content": "Tell me about the weather."}])


def test_score_is_the_models_log_softmax_at_each_forced_position(
    backend: CausalLMBackend, prompt: list[int]
) -> None:
    """Forced-token logprobs equal an independent full forward pass, position by position."""
    forced = [*backend.encode("Sunny."), EOS]
    scored = backend.score(prompt, forced)
    with torch.inference_mode():
        logits_TV = backend.model(input_ids=torch.tensor([prompt + forced])).logits[0]
    logprobs_TV = torch.log_softmax(logits_TV, dim=-1)
    expected = [float(logprobs_TV[len(prompt) - 1 + i, t]) for i, t in enumerate(forced)]
    assert [t.token_id for t in scored] == forced
    assert [t.logprob for t in scored] == pytest.approx(expected, abs=1e-5)
    assert all(t.logprob < 0 for t in scored)


def test_sampled_logprobs_match_teacher_forcing_the_same_tokens(
    backend: CausalLMBackend, prompt: list[int]
) -> None:
    """KV-cached generation reports the same logprobs as re-scoring its tokens in one pass."""
    params = RequestSampling(max_tokens=16, temperature=1.0, seed=5, ignore_eos=True)
    generation = backend.sample(prompt, params, seed=5)
    rescored = backend.score(prompt, generation.token_ids)
    assert len(generation.tokens) == 16 and generation.finish_reason == "length"
    assert [t.logprob for t in generation.tokens] == pytest.approx(
        [t.logprob for t in rescored], abs=1e-4
    )


def test_sampling_is_reproducible_by_seed(backend: CausalLMBackend, prompt: list[int]) -> None:
    """The same seed gives the same tokens; other seeds give other tokens."""
    params = RequestSampling(max_tokens=12, ignore_eos=True)
    runs = {s: backend.sample(prompt, params, seed=s).token_ids for s in (1, 1, 2, 3)}
    assert backend.sample(prompt, params, seed=1).token_ids == runs[1]
    assert len({tuple(v) for v in runs.values()}) == 3


def test_greedy_and_degenerate_filters_pick_the_argmax(
    backend: CausalLMBackend, prompt: list[int]
) -> None:
    """temperature 0, top_k 1 and a tiny top_p all choose the most likely token every step."""
    greedy = backend.sample(prompt, RequestSampling(max_tokens=8, temperature=0.0), seed=0)
    for token in greedy.tokens:
        assert token.top == ()
    rescored = backend.score(prompt, greedy.token_ids, top_logprobs=1)
    assert all(t.top[0][0] == t.token_id for t in rescored)
    for params in (
        RequestSampling(max_tokens=8, top_k=1),
        RequestSampling(max_tokens=8, top_p=1e-6),
    ):
        assert backend.sample(prompt, params, seed=9).token_ids == greedy.token_ids


def test_top_logprobs_are_sorted_alternatives(backend: CausalLMBackend, prompt: list[int]) -> None:
    """k alternatives per position, best first, each with its decoded text."""
    scored = backend.score(prompt, backend.encode("ok"), top_logprobs=3)
    for token in scored:
        assert len(token.top) == 3
        logprobs = [lp for _, lp, _ in token.top]
        assert logprobs == sorted(logprobs, reverse=True)
        assert logprobs[0] >= token.logprob
        assert token.top[0][2] == backend.token_text(token.top[0][0])


def test_stop_token_ids_and_stop_strings_end_generation(
    backend: CausalLMBackend, prompt: list[int]
) -> None:
    """A stop token id ends with stop_reason = id; a stop string ends, text cut before it."""
    free = backend.sample(
        prompt, RequestSampling(max_tokens=20, temperature=0.0, ignore_eos=True), seed=0
    )
    first = free.token_ids[0]
    by_id = backend.sample(
        prompt, RequestSampling(max_tokens=20, temperature=0.0, stop_token_ids=(first,)), seed=0
    )
    assert by_id.token_ids == [first]
    assert (by_id.finish_reason, by_id.stop_reason) == ("stop", first)
    text = backend.decode(free.token_ids)
    stop = text[3:5]
    by_text = backend.sample(
        prompt,
        RequestSampling(max_tokens=20, temperature=0.0, stop=(stop,), ignore_eos=True),
        seed=0,
    )
    assert by_text.finish_reason == "stop" and by_text.stop_reason == stop
    assert by_text.token_ids == free.token_ids[: len(by_text.token_ids)]
    assert by_text.text_end is not None
    decoded = backend.decode(by_text.token_ids)
    assert decoded[by_text.text_end :].startswith(stop)
    assert stop not in decoded[: by_text.text_end]


class _PreferEOS(torch.nn.Module):
    """An output head that adds 100 to the EOS logit."""

    def __init__(self, head: torch.nn.Module) -> None:
        super().__init__()
        self.head = head

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = self.head(hidden)
        logits[..., EOS] += 100.0
        return logits


def test_generation_stops_at_eos_and_includes_it() -> None:
    """A model that always prefers EOS stops after one token, which is the EOS, finish "stop"."""
    backend = CausalLMBackend.tiny(0)
    backend.model.lm_head = _PreferEOS(backend.model.lm_head)
    generation = backend.sample([104, 105], RequestSampling(max_tokens=10), seed=0)
    assert generation.token_ids == [EOS]
    assert generation.finish_reason == "stop" and generation.stop_reason is None


def test_context_overflow_uses_vllm_wording(backend: CausalLMBackend) -> None:
    """Prompt past the window, or prompt + max_tokens past it: 400 with "maximum context length"."""
    small = CausalLMBackend(backend.model, backend.tokenizer, name_or_path="s", max_model_len=10)
    with pytest.raises(BadRequestError, match="maximum context length is 10 tokens") as caught:
        small.check_prompt(list(range(10)), None)
    assert caught.value.status == 400
    with pytest.raises(
        BadRequestError, match="'max_tokens' or 'max_completion_tokens' is too large"
    ):
        small.check_prompt(list(range(4)), 7)
    assert small.check_prompt(list(range(4)), None) == 6
    with pytest.raises(BadRequestError, match="out of vocabulary"):
        small.check_prompt([1, 999], 1)
