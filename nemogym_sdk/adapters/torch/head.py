"""Completion logprobs without the ``[B, T, V]`` logits: the LM head a chunk of positions at a time.

At a real vocabulary the logits dominate a learner's memory: one 16k-token row at V = 151,669
is 9.7 GB of fp32 logits, and the log-softmax makes a second copy. `chunked_logprobs` runs the
model's decoder once, then the LM head, the sampler's processing and the log-softmax on
``chunk`` positions at a time, keeping only each position's logprob; under autograd each chunk
is checkpointed, so the backward pass recomputes that chunk's logits instead of keeping them.
Values and gradients equal the one-pass computation's up to float rounding.

This needs a model whose logits are its head applied to the decoder's last hidden state, as
transformers' causal LMs (Llama, Qwen2, Qwen3, Mistral ...) are. `split_head` checks that once
per model, on a few tokens, and declines models that change the logits after the head (Gemma's
soft-capping, Cohere's logit scale), sharded ones (FSDP: its hooks gather parameters around
the whole model's forward) and anything it cannot split; those keep the one-pass computation.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint

from nemogym_sdk.logits import process_logits

__all__ = ["chunked_logprobs", "picked_logprobs", "split_head"]

_SPLITS: weakref.WeakKeyDictionary[torch.nn.Module, tuple[Any, Any] | None] = (
    weakref.WeakKeyDictionary()
)
_CHECK_TOLERANCE = 1e-4
"""Largest difference between the model's logits and head(decoder) that still counts as
the same computation (float rounding of a different kernel order, not a transform)."""


def split_head(model: torch.nn.Module) -> tuple[Any, Any] | None:
    """``(decoder, head)`` such that ``model``'s logits are ``head(decoder(...)[0])``, or None.

    Checked once per model (cached) by comparing both computations on a few tokens.
    """
    if model not in _SPLITS:
        _SPLITS[model] = _find_split(model)
    return _SPLITS[model]


def _find_split(model: torch.nn.Module) -> tuple[Any, Any] | None:
    if _sharded(model):
        return None
    get_base = getattr(model, "get_base_model", None)  # a peft model: its LoRA layers are inside
    base = get_base() if callable(get_base) else model
    get_decoder = getattr(base, "get_decoder", None)
    get_head = getattr(base, "get_output_embeddings", None)
    if not (callable(get_decoder) and callable(get_head)):
        return None
    try:
        decoder, head = get_decoder(), get_head()
    except (AttributeError, NotImplementedError):
        return None
    if not isinstance(decoder, torch.nn.Module) or not isinstance(head, torch.nn.Module):
        return None
    return (decoder, head) if _same_logits(model, decoder, head) else None


def _sharded(model: torch.nn.Module) -> bool:
    """Whether FSDP (either version) holds the parameters."""
    if any(type(module).__name__ == "FullyShardedDataParallel" for module in model.modules()):
        return True
    return any(type(parameter).__name__ == "DTensor" for parameter in model.parameters())


def _same_logits(model: torch.nn.Module, decoder: Any, head: Any) -> bool:
    """Whether head(decoder(x)) is the model's logits on a probe of a few tokens."""
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    vocab = getattr(head, "out_features", None) or 2
    probe = torch.arange(5, device=device).remainder(int(vocab)).unsqueeze(0)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            expected = model(input_ids=probe, use_cache=False).logits.float()
            hidden = decoder(input_ids=probe, use_cache=False)[0]
            got = head(hidden).float()
    except (TypeError, ValueError, RuntimeError):
        return False
    finally:
        model.train(was_training)
    if got.shape != expected.shape:
        return False
    return bool((got - expected).abs().max() <= _CHECK_TOLERANCE * (1 + expected.abs().max()))


def chunked_logprobs(
    head: Any,
    hidden_BtH: torch.Tensor,
    ids_Bt: torch.Tensor,
    *,
    chunk: int,
    temperature: float,
    top_p: float,
) -> torch.Tensor:
    """Each token's logprob under ``head(hidden)``, processed like the sampler's: ``[B, t]``
    float32, computed ``chunk`` positions at a time (checkpointed under autograd)."""
    pieces = []
    for start in range(0, ids_Bt.shape[1], chunk):
        hidden = hidden_BtH[:, start : start + chunk]
        ids = ids_Bt[:, start : start + chunk]
        if torch.is_grad_enabled() and hidden.requires_grad:
            piece = checkpoint(
                _head_logprobs, head, hidden, ids, temperature, top_p, use_reentrant=False
            )
        else:
            piece = _head_logprobs(head, hidden, ids, temperature, top_p)
        pieces.append(piece)
    return torch.cat(pieces, dim=1)


def picked_logprobs(
    logits_BtV: torch.Tensor, ids_Bt: torch.Tensor, *, temperature: float, top_p: float
) -> torch.Tensor:
    """Each token's logprob under ``logits`` processed like the sampler's (float32)."""
    processed_BtV = process_logits(logits_BtV.float(), temperature=temperature, top_p=top_p)
    picked_Bt = processed_BtV.gather(-1, ids_Bt.unsqueeze(-1)).squeeze(-1)
    return picked_Bt - torch.logsumexp(processed_BtV, dim=-1)


def _head_logprobs(
    head: Any, hidden_BcH: torch.Tensor, ids_Bc: torch.Tensor, temperature: float, top_p: float
) -> torch.Tensor:
    return picked_logprobs(head(hidden_BcH), ids_Bc, temperature=temperature, top_p=top_p)
