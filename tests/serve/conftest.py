"""Fixtures for the model-server tests: tiny backends and in-process servers on 127.0.0.1."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from nemogym_sdk.serve.engine import Mode

MODEL_NAME = "tiny"
WEATHER_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
TIME_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {
            "type": "object",
            "properties": {
                "zone": {"type": "string", "enum": ["UTC", "CET"]},
                "hour24": {"type": "boolean"},
            },
            "required": ["zone", "hour24"],
        },
    },
}


def make_server(
    mode: Mode, *, tool_turns: int = 2, seed: int = 0, versions: Any = None, parsers: Any = None
) -> Any:
    """Start a ServerThread over a fresh tiny backend (caller stops it); ``versions`` is a
    ``ServedVersions`` (default: one version per adapter name), ``parsers`` the
    ``OutputParsers`` (default: hermes tool calls)."""
    from nemogym_sdk.serve import CausalLMBackend, ServeEngine, ServerThread

    engine = ServeEngine(
        CausalLMBackend.tiny(seed),
        served_model_name=MODEL_NAME,
        mode=mode,
        scripted_tool_turns=tool_turns,
        seed=seed,
        versions=versions,
        parsers=parsers,
    )
    return ServerThread(engine).start()


@pytest.fixture(scope="module")
def scripted_server() -> Iterator[Any]:
    """A scripted-mode server (2 tool turns) on an ephemeral loopback port."""
    pytest.importorskip("transformers")
    server = make_server("scripted")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def sample_server() -> Iterator[Any]:
    """A sample-mode server on an ephemeral loopback port."""
    pytest.importorskip("transformers")
    server = make_server("sample")
    yield server
    server.stop()


def save_random_lora(directory: Path, seed: int, *, rank: int = 4) -> Path:
    """Save a PEFT LoRA adapter for the tiny model with non-zero random A and B weights."""
    pytest.importorskip("peft")
    import torch
    from peft import LoraConfig, get_peft_model

    from nemogym_sdk.serve.tiny import build_tiny_model

    config = LoraConfig(
        r=rank, lora_alpha=2 * rank, target_modules=["q_proj", "v_proj"], init_lora_weights=False
    )
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", ".*is_gradient_checkpointing", FutureWarning)
        model = get_peft_model(build_tiny_model(0), config)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.3)
    model.save_pretrained(str(directory))
    return directory


def peft_logprobs(adapter: str | Path, prompt: list[int], forced: list[int]) -> list[float]:
    """Independent HF + PEFT logprobs of ``forced`` after ``prompt`` (the tiny model, seed 0)."""
    import torch
    from peft import PeftModel

    from nemogym_sdk.serve.tiny import build_tiny_model

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", ".*is_gradient_checkpointing", FutureWarning)
        model = PeftModel.from_pretrained(build_tiny_model(0), str(adapter))
    with torch.inference_mode():
        logits_TV = model(input_ids=torch.tensor([prompt + forced])).logits[0]
    logprobs_TV = torch.log_softmax(logits_TV, dim=-1)
    return [float(logprobs_TV[len(prompt) - 1 + i, t]) for i, t in enumerate(forced)]
