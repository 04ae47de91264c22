"""Fixtures for the PyTorch adapter tests: the tiny model, peft policies, small batches."""

from __future__ import annotations

import warnings
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

from nemogym_sdk import Rollout, RolloutStatus  # noqa: E402
from nemogym_sdk.serve.tiny import build_tiny_model  # noqa: E402

PAD = 259
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def lora_policy(seed: int = 0, *, rank: int = 4, perturb: float = 0.0) -> Any:
    """The tiny model (weights from ``seed``) with a LoRA adapter; ``perturb`` > 0 fills B too.

    Deterministic: peft draws A from the global RNG, which is seeded here and restored after.
    """
    with warnings.catch_warnings(), torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        warnings.filterwarnings("ignore", ".*is_gradient_checkpointing", FutureWarning)
        model = peft.get_peft_model(
            build_tiny_model(seed),
            peft.LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=LORA_TARGETS),
        )
    if perturb:
        generator = torch.Generator().manual_seed(seed + 1)
        with torch.no_grad():
            for name, param in model.named_parameters():
                if "lora_B" in name:
                    param.copy_(torch.randn(param.shape, generator=generator) * perturb)
    return model


def rollout(
    prompt: list[int],
    completion: list[int],
    env_mask: list[int],
    *,
    row: str = "r0",
    repeat: int = 0,
    reward: float = 0.0,
    status: RolloutStatus = RolloutStatus.OK,
) -> Rollout:
    """An OK rollout with zero sampling logprobs (tests fill real ones where they matter)."""
    return Rollout(
        prompt_ids=prompt,
        completion_ids=completion,
        env_mask=env_mask,
        logprobs=[0.0] * len(completion),
        reward=reward,
        num_turns=1,
        status=status,
        row_id=row,
        repeat_index=repeat,
    )


@pytest.fixture
def rollouts() -> list[Rollout]:
    """Three rows of different lengths; the second has environment tokens (mask 0) inside::

    r0  prompt 5 tokens   completion [97 98 99 258]              mask [1 1 1 1]
    r1  prompt 9 tokens   completion [100 101 10 10 10 102 258]  mask [1 1 0 0 0 1 1]
    r2  prompt 3 tokens   completion [120 258]                   mask [1 1]
    """
    return [
        rollout([257, 117, 10, 104, 105], [97, 98, 99, 258], [1, 1, 1, 1], reward=1.0),
        rollout(
            [257, 117, 10, 111, 107, 32, 103, 111, 10],
            [100, 101, 10, 10, 10, 102, 258],
            [1, 1, 0, 0, 0, 1, 1],
            repeat=1,
        ),
        rollout([257, 97, 10], [120, 258], [1, 1], repeat=2, reward=0.5),
    ]
