"""A tiny PEFT LoRA model and a way to give it new weights, for tests that publish adapter
versions (the model is the SDK's tiny Llama, built in process)."""

from __future__ import annotations

import warnings
from typing import Any


def tiny_lora() -> Any:
    """The tiny model with a fresh r=4 LoRA on q_proj and v_proj (A drawn from seed 0)."""
    import torch
    from peft import LoraConfig, get_peft_model

    from nemogym_sdk.serve.tiny import build_tiny_model

    torch.manual_seed(0)
    config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", ".*is_gradient_checkpointing", FutureWarning)
        return get_peft_model(build_tiny_model(0), config)


def perturb(model: Any, seed: int, scale: float = 0.3) -> None:
    """Random LoRA weights (what a few optimizer steps would do): each seed a new version."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * scale)
