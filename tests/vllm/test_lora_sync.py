"""LoraSync against real vLLM: version 0 is the base model, each sync reloads in place, and
the served logprobs change exactly when the adapter's weights do.

Every request here is sequential, and the base model is scored only while no LoRA request
is in flight (vLLM 0.32's CPU LoRA ops apply an adapter to base rows that share a batch
with LoRA rows).
"""

from __future__ import annotations

import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from nemogym_sdk.gym import BackendProcess
from nemogym_sdk.lora import LoraSync

from .conftest import MODEL_SEED, SERVED_NAME, score, unload_adapter

torch = pytest.importorskip("torch")
peft = pytest.importorskip("peft")
pytest.importorskip("transformers")

pytestmark = [pytest.mark.gym, pytest.mark.slow, pytest.mark.vllm]

LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
PROMPT = [257, 117, 115, 101, 114, 10, 119, 104, 121, 63, 258, 10, 257, 97, 10]
"""``<|im_start|>user\\nwhy?<|im_end|>\\n<|im_start|>a\\n``."""
COMPLETION = [98, 101, 99, 97, 117, 115, 101, 46, 258]
"""``because.<|im_end|>``: a fixed completion, scored rather than sampled."""
SAME = 1e-5
"""vLLM fp32 against itself: the same weights score the same."""
LEARNER = 1e-4
"""vLLM fp32 against transformers + peft in this process."""


def learner_policy() -> Any:
    """The tiny model (the served weights) with a rank-8 LoRA on every linear layer; B = 0."""
    from nemogym_sdk.serve.tiny import build_tiny_model

    with warnings.catch_warnings(), torch.random.fork_rng(devices=[]):
        torch.manual_seed(1)
        warnings.filterwarnings("ignore", ".*is_gradient_checkpointing", FutureWarning)
        model = peft.get_peft_model(
            build_tiny_model(MODEL_SEED),
            peft.LoraConfig(r=8, lora_alpha=16, target_modules=LORA_TARGETS),
        )
    model.train(False)
    return model


def learner_logprobs(model: Any) -> list[float]:
    """transformers + peft logprobs of COMPLETION after PROMPT."""
    with torch.inference_mode():
        logits_TV = model(input_ids=torch.tensor([PROMPT + COMPLETION])).logits[0]
    logprobs_TV = torch.log_softmax(logits_TV.double(), dim=-1)
    return [float(logprobs_TV[len(PROMPT) - 1 + i, t]) for i, t in enumerate(COMPLETION)]


def change_weights(model: Any, seed: int) -> None:
    """A real weight change: every lora_B drawn at random (what a few optimizer steps do)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.3)


def max_diff(a: list[float], b: list[float]) -> float:
    return max(abs(x - y) for x, y in zip(a, b, strict=True))


def adapter_card(backend: BackendProcess, name: str) -> dict[str, Any] | None:
    cards = requests.get(f"{backend.base_url}/models", timeout=10).json()["data"]
    return next((card for card in cards if card["id"] == name), None)


@pytest.fixture
def adapter_name(vllm_backend: BackendProcess) -> Iterator[str]:
    """A fresh adapter name, unloaded from the shared server after the test."""
    name = f"policy-{uuid.uuid4().hex[:8]}"
    yield name
    unload_adapter(vllm_backend, name)


def test_lora_sync_versions_change_logprobs_exactly_when_the_adapter_does(
    vllm_backend: BackendProcess, adapter_name: str, tmp_path: Path
) -> None:
    """initialize publishes the zero adapter (v0 scores as the base model); sync after a
    weight change reloads in place (v1 differs, and matches transformers + peft); sync
    without a change (v2) scores as v1. served_version follows every step."""
    model = learner_policy()
    base = score(vllm_backend, SERVED_NAME, PROMPT, COMPLETION)
    with LoraSync(vllm_backend.base_url, adapter_name, tmp_path) as sync:
        caps = sync.probe()
        assert caps.supports_lora and caps.inplace and adapter_name not in caps.adapters

        # v0: the zero adapter, listed under its name, scores as the base model.
        v0 = sync.initialize(model)
        assert (v0.version, v0.inplace) == (0, False)
        card = adapter_card(vllm_backend, adapter_name)
        assert card is not None and card["root"] == v0.path and card["parent"] == SERVED_NAME
        assert sync.served_version() == 0
        lp0 = score(vllm_backend, adapter_name, PROMPT, COMPLETION)
        assert max_diff(lp0, base) < SAME
        learner0 = learner_logprobs(model)
        assert max_diff(lp0, learner0) < LEARNER

        # v1: real new weights, loaded in place; vLLM now scores what the learner scores.
        change_weights(model, seed=7)
        v1 = sync.sync(model)
        assert (v1.version, v1.inplace) == (1, True)
        assert sync.served_version() == 1
        lp1 = score(vllm_backend, adapter_name, PROMPT, COMPLETION)
        learner1 = learner_logprobs(model)
        assert max_diff(lp1, lp0) > 0.05
        assert max_diff(lp1, learner1) < LEARNER

        # v2: the same weights again; a new version, the same distribution.
        v2 = sync.sync(model)
        assert (v2.version, v2.inplace) == (2, True)
        assert sync.served_version() == 2
        assert max_diff(score(vllm_backend, adapter_name, PROMPT, COMPLETION), lp1) < SAME

        # the base model is untouched by the adapter's versions
        assert max_diff(score(vllm_backend, SERVED_NAME, PROMPT, COMPLETION), base) < SAME


def test_a_refused_load_raises_and_the_served_version_stays(
    vllm_backend: BackendProcess, adapter_name: str, tmp_path: Path
) -> None:
    """An adapter above --max-lora-rank 8 is refused by vLLM: sync raises with vLLM's own
    message, the version does not advance, and the last confirmed version still serves."""
    from nemogym_sdk.lora import LoraSyncError

    model = learner_policy()
    with LoraSync(vllm_backend.base_url, adapter_name, tmp_path) as sync:
        sync.initialize(model)
        lp0 = score(vllm_backend, adapter_name, PROMPT, COMPLETION)
        with warnings.catch_warnings(), torch.random.fork_rng(devices=[]):
            warnings.filterwarnings("ignore", ".*is_gradient_checkpointing", FutureWarning)
            from nemogym_sdk.serve.tiny import build_tiny_model

            too_big = peft.get_peft_model(
                build_tiny_model(MODEL_SEED), peft.LoraConfig(r=16, target_modules=["q_proj"])
            )
        change_weights(too_big, seed=3)
        with pytest.raises(LoraSyncError, match="max_lora_rank") as refused:
            sync.sync(too_big)
        assert refused.value.status >= 400
        assert sync.version == 0 and sync.served_version() == 0
        assert max_diff(score(vllm_backend, adapter_name, PROMPT, COMPLETION), lp0) < SAME
