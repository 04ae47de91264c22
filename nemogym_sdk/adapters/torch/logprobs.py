"""Per-token logprobs of a causal LM over a ``Batch``: prompt and completion in one forward.

A ``Batch`` holds left-padded prompts ``[B, P]`` and right-padded completions ``[B, T]``; one
row of the forward input is ``prompt ++ completion`` (``[B, P + T]``). Padding is respected
three ways: the attention mask hides pad tokens, position ids count only real tokens (so a
left-padded prompt gets the same positions as an unpadded one), and logprobs at padded
completion positions are 0.0. Rows are processed ``chunk_size`` at a time, each chunk cut to
its own longest prompt and completion, which bounds memory and wastes no compute on padding.
Completions longer than ``head_chunk`` tokens go through the LM head ``head_chunk`` positions
at a time (`nemogym_sdk.adapters.torch.head`), so no ``[B, T, V]`` logits tensor is made.

The logit for completion token ``t`` sits at input position ``P - 1 + t``; with
``logits_to_keep`` (transformers' causal LMs) only those ``T + 1`` positions reach the LM head.
"""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Mapping
from typing import Any

import torch

from nemogym_sdk.adapters.torch.head import chunked_logprobs, picked_logprobs, split_head
from nemogym_sdk.errors import ConfigError
from nemogym_sdk.policy import SamplingParams
from nemogym_sdk.records import Batch

__all__ = ["completion_logprobs", "learner_processing", "model_device", "token_logprobs"]

_INPUT_KEYS = ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask")
HEAD_CHUNK = 1024
"""Completion positions per pass through the LM head (the logits of one pass: ``[B, 1024, V]``)."""


def learner_processing(sampling: SamplingParams | None) -> tuple[float, float]:
    """``(temperature, top_p)`` the learner applies for rollouts played with ``sampling``.

    A field left as None (or ``sampling=None``) means the OpenAI / vLLM default, 1.0: no
    scaling, no nucleus cut. ``max_output_tokens`` caps the sampler only. Greedy sampling
    (temperature 0) has no distribution to compute an importance ratio against, so it is a
    ``ConfigError``, as is a ``top_p`` outside ``(0, 1]``. ``top_k`` is not a setting: NeMo
    Gym's Responses API cannot carry it, so the sampler never applies one.
    """
    settings = sampling if sampling is not None else SamplingParams()
    temperature = 1.0 if settings.temperature is None else float(settings.temperature)
    top_p = 1.0 if settings.top_p is None else float(settings.top_p)
    if not (math.isfinite(temperature) and temperature > 0):
        raise ConfigError(
            f"the learner needs the sampler's temperature > 0, got {temperature!r}: greedy "
            f"sampling has no distribution to compute an importance ratio against"
        )
    if not 0.0 < top_p <= 1.0:
        raise ConfigError(f"top_p must be in (0, 1], got {top_p!r}")
    return temperature, top_p


def token_logprobs(
    model: torch.nn.Module,
    batch: Batch | Mapping[str, torch.Tensor],
    *,
    sampling: SamplingParams | None = None,
    chunk_size: int | None = 8,
    device: str | torch.device | None = None,
    head_chunk: int | None = HEAD_CHUNK,
) -> torch.Tensor:
    """The model's logprob of each completion token, ``[B, T]`` float32 (0.0 on padding).

    Args:
        model: a causal LM returning ``.logits`` (a transformers model, or a peft model).
        batch: a ``Batch``, or the tensors of ``Batch.to_torch()``.
        sampling: the settings the rollouts were played with (the client's
            ``SamplingParams``): the logits are divided by its temperature and cut to its
            top-p before the log-softmax, so the result is comparable with
            ``processed_logprobs``. None, or a field left None, means 1.0 (the raw
            log-softmax); see `learner_processing`.
        chunk_size: rows per forward pass (None: all rows at once).
        device: where to run; defaults to the model's device.
        head_chunk: completion positions per pass through the LM head, for a model whose
            head can be split off (`nemogym_sdk.adapters.torch.head.split_head`); None:
            the whole completion's logits at once.

    Gradients flow when called outside ``torch.no_grad()``. The logits are cast to float32
    before the processing and the log-softmax, whatever the model's dtype.
    """
    temperature, top_p = learner_processing(sampling)
    if chunk_size is not None and chunk_size < 1:
        raise ConfigError(f"chunk_size must be >= 1, got {chunk_size}")
    target = torch.device(device) if device is not None else model_device(model)
    tensors = _inputs(batch, target)
    rows = tensors["prompt_ids"].shape[0]
    step = rows if chunk_size is None else chunk_size
    parts = [
        completion_logprobs(
            model,
            *(tensors[key][start : start + step] for key in _INPUT_KEYS),
            temperature=temperature,
            top_p=top_p,
            head_chunk=head_chunk,
        )
        for start in range(0, rows, step)
    ]
    return torch.cat(parts, dim=0)


def completion_logprobs(
    model: torch.nn.Module,
    prompt_ids_BP: torch.Tensor,
    prompt_mask_BP: torch.Tensor,
    completion_ids_BT: torch.Tensor,
    completion_mask_BT: torch.Tensor,
    *,
    temperature: float = 1.0,
    top_p: float = 1.0,
    head_chunk: int | None = HEAD_CHUNK,
) -> torch.Tensor:
    """One forward pass over a few rows; returns ``[B, T]`` (see `token_logprobs`; the
    processing numbers come from `learner_processing`)."""
    if head_chunk is not None and head_chunk < 1:
        raise ConfigError(f"head_chunk must be >= 1, got {head_chunk}")
    B, P = prompt_ids_BP.shape
    T = completion_ids_BT.shape[1]
    # Cut the chunk to its own longest prompt (left-padded) and completion (right-padded).
    p_real = int(prompt_mask_BP.sum(dim=1).max()) if B else 0
    t_real = int(completion_mask_BT.sum(dim=1).max()) if B else 0
    out_BT = torch.zeros((B, T), dtype=torch.float32, device=completion_ids_BT.device)
    if B == 0 or t_real == 0:
        return out_BT
    if p_real == 0:
        raise ConfigError("every row needs at least one prompt token to predict its completion")
    prompt_ids_BP, prompt_mask_BP = prompt_ids_BP[:, P - p_real :], prompt_mask_BP[:, P - p_real :]
    completion_ids_Bt = completion_ids_BT[:, :t_real]
    completion_mask_Bt = completion_mask_BT[:, :t_real].bool()

    input_ids_BL = torch.cat([prompt_ids_BP, completion_ids_Bt], dim=1)  # L = p_real + t_real
    attention_BL = torch.cat([prompt_mask_BP.long(), completion_mask_Bt.long()], dim=1)
    positions_BL = (attention_BL.cumsum(dim=1) - 1).clamp(min=0)
    kwargs: dict[str, Any] = {
        "input_ids": input_ids_BL,
        "attention_mask": attention_BL,
        "position_ids": positions_BL,
        "use_cache": False,
    }
    processing = {"temperature": temperature, "top_p": top_p}
    split = split_head(model) if head_chunk is not None and t_real > head_chunk else None
    if split is not None:
        decoder, head = split
        hidden_BLH = decoder(**kwargs)[0]
        hidden_BtH = hidden_BLH[:, -(t_real + 1) : -1]  # position P-1+t predicts token t
        logprobs_Bt = chunked_logprobs(
            head, hidden_BtH, completion_ids_Bt, chunk=head_chunk or t_real, **processing
        )
    else:
        if _accepts_logits_to_keep(model):
            kwargs["logits_to_keep"] = t_real + 1
        logits_BtV = model(**kwargs).logits[:, -(t_real + 1) : -1]
        logprobs_Bt = picked_logprobs(logits_BtV, completion_ids_Bt, **processing)
    # where(), not a product: a padded position may hold -inf or NaN, and 0 * nan is nan.
    logprobs_Bt = torch.where(completion_mask_Bt, logprobs_Bt, torch.zeros_like(logprobs_Bt))
    if t_real == T:
        return logprobs_Bt
    return torch.cat([logprobs_Bt, out_BT[:, t_real:]], dim=1)


def _inputs(batch: Batch | Mapping[str, torch.Tensor], device: torch.device) -> dict[str, Any]:
    if isinstance(batch, Batch):
        return {
            key: torch.tensor(getattr(batch, key), dtype=torch.long, device=device)
            for key in _INPUT_KEYS
        }
    missing = [key for key in _INPUT_KEYS if key not in batch]
    if missing:
        raise ConfigError(f"batch tensors lack {missing}; pass a Batch or Batch.to_torch()")
    return {key: batch[key].to(device=device) for key in _INPUT_KEYS}


def model_device(model: torch.nn.Module) -> torch.device:
    """Where the model's first parameter lives (CPU for a model without parameters)."""
    for parameter in model.parameters():
        return parameter.device
    return torch.device("cpu")


def _accepts_logits_to_keep(model: torch.nn.Module) -> bool:
    """Whether the (unwrapped) model's forward takes ``logits_to_keep``."""
    base = model
    get_base = getattr(model, "get_base_model", None)  # peft wrappers forward **kwargs
    if callable(get_base):
        base = get_base()
    return _forward_takes(type(base).__qualname__, type(base).forward, "logits_to_keep")


@functools.cache
def _forward_takes(owner: str, forward: Any, name: str) -> bool:
    del owner  # part of the cache key only
    try:
        return name in inspect.signature(forward).parameters
    except (TypeError, ValueError):
        return False
