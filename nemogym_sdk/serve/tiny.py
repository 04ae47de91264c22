"""A tiny causal LM, byte-level tokenizer and chat template, built in process (no downloads).

The tokenizer has one token per byte (ids 0-255, byte value = id) plus four special tokens::

    256 <|endoftext|>   257 <|im_start|>   258 <|im_end|> (EOS)   259 <|pad|>

The model is a randomly initialised ``LlamaForCausalLM`` (2 layers, hidden 64, 2 heads of
dimension 32 so that vLLM's CPU attention kernels accept it too), deterministic from a seed.
`save_tiny` writes both to a directory that ``transformers`` (and vLLM) can load by path.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nemogym_sdk.serve._deps import require_serve_deps

if TYPE_CHECKING:
    from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

__all__ = [
    "BOS_TOKEN",
    "CHAT_TEMPLATE",
    "EOS_TOKEN",
    "IM_START_TOKEN",
    "PAD_TOKEN",
    "TINY_MODEL_NAME",
    "TINY_SHAPE",
    "build_tiny_model",
    "build_tiny_tokenizer",
    "byte_to_unicode",
    "save_tiny",
    "seeded_model",
    "seeded_rng",
]

TINY_MODEL_NAME = "nemogym-tiny"
"""Default served model name of the tiny model."""

TINY_SHAPE: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "max_position_embeddings": 32768,
    "initializer_range": 0.2,
    "tie_word_embeddings": False,
}
"""The shape of every tiny model (this byte-level one and each model family's,
`nemogym_sdk.serve.families`): config keyword arguments beside the vocabulary and token ids."""

BOS_TOKEN = "<|endoftext|>"
IM_START_TOKEN = "<|im_start|>"
EOS_TOKEN = "<|im_end|>"
PAD_TOKEN = "<|pad|>"
_SPECIAL_TOKENS = (BOS_TOKEN, IM_START_TOKEN, EOS_TOKEN, PAD_TOKEN)

CHAT_TEMPLATE = (
    "{%- macro content_text(content) -%}"
    "{%- if content is string -%}{{- content -}}"
    "{%- elif content is iterable and content is not mapping -%}"
    "{%- for part in content -%}"
    "{%- if part is mapping and part.text is defined and part.text is string -%}"
    "{{- part.text -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- endif -%}"
    "{%- endmacro -%}"
    "{%- if tools -%}"
    "{{- '<|im_start|>system\\n# Tools\\n\\nYou may call one or more functions. "
    "Function signatures:\\n<tools>' -}}"
    "{%- for tool in tools -%}{{- '\\n' + (tool | tojson) -}}{%- endfor -%}"
    "{{- '\\n</tools>\\n\\nTo call a function, reply with:\\n<tool_call>\\n"
    '{"name": <function-name>, "arguments": <args-json-object>}'
    "\\n</tool_call><|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message.role + '\\n' -}}"
    "{%- set text = content_text(message.content) -%}"
    "{{- text -}}"
    "{%- if message.role == 'assistant' and message.tool_calls -%}"
    "{%- for call in message.tool_calls -%}"
    "{%- set fn = call.function if call.function is defined else call -%}"
    "{%- if not loop.first or text -%}{{- '\\n' -}}{%- endif -%}"
    "{{- '<tool_call>\\n{\"name\": ' + (fn.name | tojson) + ', \"arguments\": ' -}}"
    "{%- set args = fn.arguments if fn.arguments is defined else {} -%}"
    "{%- if args is string -%}{{- args -}}{%- else -%}{{- args | tojson -}}{%- endif -%}"
    "{{- '}\\n</tool_call>' -}}"
    "{%- endfor -%}"
    "{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)
"""ChatML-style template: a tools system block, one ``<|im_start|>role ... <|im_end|>`` block per
message (system, developer, user, assistant, tool), assistant ``tool_calls`` as ``<tool_call>``
blocks, and ``<|im_start|>assistant\\n`` as the generation prompt."""


def byte_to_unicode() -> dict[int, str]:
    """Return the GPT-2 byte-level alphabet: each byte mapped to one printable character.

    Printable Latin-1 bytes map to themselves; the others map, in byte order, to code points
    from 256 on. This is the alphabet the ``tokenizers`` ByteLevel pre-tokenizer produces.
    """
    printable = {
        *range(ord("!"), ord("~") + 1),
        *range(0xA1, 0xAC + 1),
        *range(0xAE, 0xFF + 1),
    }
    mapping: dict[int, str] = {}
    shifted = 0
    for byte in range(256):
        if byte in printable:
            mapping[byte] = chr(byte)
        else:
            mapping[byte] = chr(256 + shifted)
            shifted += 1
    return mapping


def build_tiny_tokenizer() -> PreTrainedTokenizerFast:
    """Return the byte-level tokenizer (260 tokens) with `CHAT_TEMPLATE`; EOS is ``<|im_end|>``."""
    require_serve_deps()
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {char: byte for byte, char in byte_to_unicode().items()}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t in _SPECIAL_TOKENS]
    )
    tokenizer = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=backend,
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        model_max_length=32768,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


_GLOBAL_RNG = threading.Lock()


@contextlib.contextmanager
def seeded_rng(seed: int, *, restore: bool = True) -> Iterator[None]:
    """torch's global CPU RNG seeded with ``seed`` for the block, one such block at a time
    in this process, and put back as it was after it (``restore=False``: left as the block
    leaves it). The RNG is the process's: the trainer builds its policy on one thread while
    another saves the model its sampler serves, and unlocked, each thread's draws would
    come from the other's seed (seen: a sampler serving other weights than the learner's)."""
    import torch

    with _GLOBAL_RNG, torch.random.fork_rng(devices=[], enabled=restore):
        torch.manual_seed(seed)
        yield


def seeded_model(model_class: Any, config: Any, seed: int) -> Any:
    """``model_class(config)`` with random weights drawn from ``seed`` (the global torch RNG
    left untouched; `seeded_rng`), its generation config's EOS, pad and BOS ids those of
    ``config``, in eval mode."""
    with seeded_rng(seed):
        model = model_class(config)
    model.generation_config.eos_token_id = config.eos_token_id
    model.generation_config.pad_token_id = config.pad_token_id
    model.generation_config.bos_token_id = config.bos_token_id
    model.train(False)
    return model


def build_tiny_model(seed: int = 0, *, vocab_size: int = 260) -> LlamaForCausalLM:
    """Return the tiny ``LlamaForCausalLM``, random weights drawn from ``seed`` (fp32, eval mode).

    The global torch RNG is left untouched.
    """
    require_serve_deps()
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab_size, bos_token_id=256, eos_token_id=258, pad_token_id=259, **TINY_SHAPE
    )
    model: LlamaForCausalLM = seeded_model(LlamaForCausalLM, config, seed)
    return model


def save_tiny(directory: str | Path, seed: int = 0) -> Path:
    """Save the tiny model and tokenizer (with chat template) to ``directory``; return its path."""
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    model: Any = build_tiny_model(seed)
    model.save_pretrained(path)
    build_tiny_tokenizer().save_pretrained(path)
    return path
