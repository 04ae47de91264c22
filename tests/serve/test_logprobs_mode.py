"""``--logprobs-mode``: raw logprobs, or those of the distribution actually sampled from."""

from __future__ import annotations

import math

import pytest

pytest.importorskip("transformers")

from nemogym_sdk.serve.backend import CausalLMBackend
from nemogym_sdk.serve.engine import ServeEngine
from nemogym_sdk.serve.interface import MASKED_LOGPROB
from nemogym_sdk.serve.protocol import RequestSampling

EOS = 258


@pytest.fixture(scope="module")
def backend() -> CausalLMBackend:
    """The tiny model, seed 0."""
    return CausalLMBackend.tiny(0)


@pytest.fixture(scope="module")
def prompt(backend: CausalLMBackend) -> list[int]:
    """A short chat prompt."""
    return backend.prompt_ids([{"role": "user", "content": "Count to three."}])


def logprobs(generation_tokens: object) -> list[float]:
    return [t.logprob for t in generation_tokens]  # type: ignore[attr-defined]


def test_plain_sampling_reports_the_same_logprobs_in_both_modes(
    backend: CausalLMBackend, prompt: list[int]
) -> None:
    """Temperature 1 without truncation: processed = raw, token for token."""
    params = RequestSampling(max_tokens=8)
    raw = backend.sample(prompt, params, seed=3)
    processed = backend.sample(prompt, params, seed=3, logprobs_mode="processed_logprobs")
    assert raw.token_ids == processed.token_ids
    assert logprobs(raw.tokens) == pytest.approx(logprobs(processed.tokens), abs=1e-6)


def test_processed_mode_renormalises_over_the_kept_tokens(
    backend: CausalLMBackend, prompt: list[int]
) -> None:
    """top_k=1 keeps one token per step: it is drawn with probability 1 (logprob 0), while the
    raw logprob of the same token is the model's, well below 0."""
    params = RequestSampling(max_tokens=6, top_k=1, temperature=0.8)
    processed = backend.sample(prompt, params, seed=0, logprobs_mode="processed_logprobs")
    raw = backend.sample(prompt, params, seed=0)
    assert raw.token_ids == processed.token_ids
    assert all(lp == pytest.approx(0.0, abs=1e-6) for lp in logprobs(processed.tokens))
    assert all(lp < -0.01 for lp in logprobs(raw.tokens))


def test_processed_temperature_is_log_softmax_of_scaled_logits(
    backend: CausalLMBackend, prompt: list[int]
) -> None:
    """Forced tokens at temperature 0.5: processed logprob = log_softmax(logits / 0.5)."""
    forced = [*backend.encode("one two"), EOS]
    raw = logprobs(backend.score(prompt, forced))
    scaled = logprobs(
        backend.score(
            prompt,
            forced,
            params=RequestSampling(temperature=0.5),
            logprobs_mode="processed_logprobs",
        )
    )
    import torch

    with torch.inference_mode():
        logits_TV = backend.model(input_ids=torch.tensor([prompt + forced])).logits[0].float()
    expected_TV = torch.log_softmax(logits_TV / 0.5, dim=-1)
    expected = [float(expected_TV[len(prompt) - 1 + i, t]) for i, t in enumerate(forced)]
    assert scaled == pytest.approx(expected, abs=1e-5)
    assert scaled != pytest.approx(raw, abs=1e-3)


def test_tokens_outside_the_support_are_reported_like_vllm(
    backend: CausalLMBackend, prompt: list[int]
) -> None:
    """A forced token outside top-k has probability 0: reported as -9999.0, never -inf/NaN."""
    forced = [*backend.encode("zzzz"), EOS]
    scored = backend.score(
        prompt,
        forced,
        params=RequestSampling(top_k=1),
        logprobs_mode="processed_logprobs",
        top_logprobs=3,
    )
    values = logprobs(scored)
    assert MASKED_LOGPROB in values
    assert all(math.isfinite(v) for v in values)
    assert all(math.isfinite(lp) for t in scored for _, lp, _ in t.top)


def test_engine_rejects_an_unknown_mode(backend: CausalLMBackend) -> None:
    """Only vLLM's two logprob modes this server implements are accepted."""
    with pytest.raises(ValueError, match="logprobs_mode"):
        ServeEngine(backend, logprobs_mode="raw_logits")  # type: ignore[arg-type]
