"""The sampler's logprobs and the learner's describe the same distribution in processed mode.

``nemogym_sdk.serve`` samples a reply under a LoRA adapter at temperature 0.7 and top-p 0.9; the
learner recomputes every reply token's logprob with ``token_logprobs`` under the same processing.
In ``processed_logprobs`` mode they agree to float32 noise; in ``raw_logprobs`` mode they do
not, which is exactly the wrong importance ratio the issue warns about.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest

from nemogym_sdk import Rollout, SamplingParams, collate
from nemogym_sdk.adapters.torch import token_logprobs
from nemogym_sdk.serve import CausalLMBackend, ServeEngine

from .conftest import PAD, lora_policy, torch

SAMPLING = SamplingParams(temperature=0.7, top_p=0.9)
"""What the rollouts are played with: the engine samples with it, the learner applies it."""


def sample_reply(mode: str, adapter_dir: Path, seed: int) -> dict[str, Any]:
    """One sampled chat reply from an engine serving the adapter as ``policy``."""
    backend = CausalLMBackend.tiny(0)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", ".*is_gradient_checkpointing", FutureWarning)
        backend.load_adapter("policy", str(adapter_dir))
    engine = ServeEngine(backend, mode="sample", logprobs_mode=mode)  # type: ignore[arg-type]
    return engine.chat(
        {
            "model": "policy",
            "messages": [{"role": "user", "content": "Say something in lowercase."}],
            "max_tokens": 24,
            "seed": seed,
            "logprobs": True,
            "return_token_ids": True,
            "temperature": SAMPLING.temperature,
            "top_p": SAMPLING.top_p,
        }
    )


def learner_view(model: Any, body: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    """(sampler logprobs, learner logprobs) of the reply's tokens."""
    choice = body["choices"][0]
    sampler = torch.tensor([e["logprob"] for e in choice["logprobs"]["content"]])
    row = Rollout(
        prompt_ids=body["prompt_token_ids"],
        completion_ids=choice["token_ids"],
        env_mask=[1] * len(choice["token_ids"]),
        logprobs=sampler.tolist(),
        reward=0.0,
    )
    with torch.no_grad():
        learner = token_logprobs(model, collate([row], pad_token_id=PAD), sampling=SAMPLING)[0]
    return sampler, learner


@pytest.fixture(scope="module")
def policy(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    model = lora_policy(perturb=0.3)
    directory = tmp_path_factory.mktemp("adapter")
    model.save_pretrained(str(directory))
    return model, directory


def test_processed_logprobs_match_the_learner(policy: tuple[Any, Path]) -> None:
    """Max |sampler - learner| over 3 sampled replies stays below 1e-4 (fp32 noise ~1e-6)."""
    model, directory = policy
    worst = 0.0
    for seed in range(3):
        sampler, learner = learner_view(model, sample_reply("processed_logprobs", directory, seed))
        assert sampler.numel() > 0
        worst = max(worst, float((sampler - learner).abs().max()))
    assert worst < 1e-4


def test_raw_logprobs_do_not(policy: tuple[Any, Path]) -> None:
    """The same replies with raw logprobs differ from the processed learner by far more."""
    model, directory = policy
    sampler, learner = learner_view(model, sample_reply("raw_logprobs", directory, 0))
    assert float((sampler - learner).abs().mean()) > 0.05
