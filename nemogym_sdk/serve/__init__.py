"""OpenAI/vLLM-compatible CPU model server that NeMo Gym's ``vllm_model`` can use as its backend.

A transformers causal LM (by default a tiny model built in process) behind vLLM's routes
(``/v1/chat/completions``, ``/tokenize``, ``/v1/models``, ``/v1/load_lora_adapter``,
``/v1/unload_lora_adapter``, ``/health``), returning token ids and logprobs, applying the on-policy
prefix splice so multi-turn token histories stay exact, and serving LoRA adapters by name.
Generations asked for at once are decoded as one batch, one forward pass per token for all of
them (``--max-num-seqs`` caps a batch, as in vLLM), each with its own seed and parameters.

Needs the ``[serve]`` extra (torch, transformers, tokenizers, peft). Nothing here is imported by
``import nemogym_sdk``; the names below load their module on first use.

Run it::

    python -m nemogym_sdk.serve --port 8000 [--mode scripted|sample] [--model DIR]

or, as a token-exact proxy in front of a vLLM server serving the same model directory
(see ``docs/vllm.md``)::

    python -m nemogym_sdk.serve --backend vllm --vllm-url http://127.0.0.1:8011/v1 --model DIR

or in process::

    from nemogym_sdk.serve import CausalLMBackend, ServeEngine, ServerThread
    with ServerThread(ServeEngine(CausalLMBackend.tiny())) as server:
        ...  # point vllm_model's base_url at server.base_url
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from nemogym_sdk.serve.app import RunningServer, ServerThread, create_app, start_server
    from nemogym_sdk.serve.backend import CausalLMBackend
    from nemogym_sdk.serve.chat import build_prompt_ids, splice_prefix
    from nemogym_sdk.serve.engine import ServeEngine
    from nemogym_sdk.serve.errors import BadRequestError, NotFoundError, ServeError
    from nemogym_sdk.serve.interface import Generation
    from nemogym_sdk.serve.record import SamplingRecorder, read_records, turn_key
    from nemogym_sdk.serve.script import Script, ScriptRule
    from nemogym_sdk.serve.template import ChatTemplate
    from nemogym_sdk.serve.tiny import (
        TINY_MODEL_NAME,
        build_tiny_model,
        build_tiny_tokenizer,
        save_tiny,
    )
    from nemogym_sdk.serve.tools import ToolCall, example_arguments, parse_tool_calls
    from nemogym_sdk.serve.vllm_backend import VllmBackend

__all__ = [
    "TINY_MODEL_NAME",
    "BadRequestError",
    "CausalLMBackend",
    "ChatTemplate",
    "Generation",
    "NotFoundError",
    "RunningServer",
    "SamplingRecorder",
    "Script",
    "ScriptRule",
    "ServeEngine",
    "ServeError",
    "ServerThread",
    "ToolCall",
    "VllmBackend",
    "build_prompt_ids",
    "build_tiny_model",
    "build_tiny_tokenizer",
    "create_app",
    "example_arguments",
    "parse_tool_calls",
    "read_records",
    "save_tiny",
    "splice_prefix",
    "start_server",
    "turn_key",
]

_HOME = {
    "RunningServer": "app",
    "ServerThread": "app",
    "create_app": "app",
    "start_server": "app",
    "CausalLMBackend": "backend",
    "Generation": "interface",
    "build_prompt_ids": "chat",
    "splice_prefix": "chat",
    "ServeEngine": "engine",
    "BadRequestError": "errors",
    "NotFoundError": "errors",
    "ServeError": "errors",
    "TINY_MODEL_NAME": "tiny",
    "build_tiny_model": "tiny",
    "build_tiny_tokenizer": "tiny",
    "save_tiny": "tiny",
    "ToolCall": "tools",
    "example_arguments": "tools",
    "parse_tool_calls": "tools",
    "ChatTemplate": "template",
    "SamplingRecorder": "record",
    "read_records": "record",
    "turn_key": "record",
    "Script": "script",
    "ScriptRule": "script",
    "VllmBackend": "vllm_backend",
}


def __getattr__(name: str) -> Any:
    module = _HOME.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
