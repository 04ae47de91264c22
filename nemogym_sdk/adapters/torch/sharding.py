"""A learner too big for one device: the policy sharded over the ranks with FSDP2.

``shard(model)`` applies torch's ``fully_shard`` (FSDP2) to each decoder layer and then to the
whole model: every rank holds a slice of every parameter, frozen base weights and LoRA weights
alike, gathers a layer's weights just before using them and frees them after. Works with NCCL
on GPUs and with gloo on CPUs (what ``tests/adapters/test_torch_fsdp.py`` runs with two ranks).

What changes for a training step (``train_step`` reads `is_sharded`):

- gradients are reduce-scattered by FSDP during backward, summed, not averaged
  (``set_gradient_divide_factor(1)``), exactly what ``train_step``'s own all-reduce does for
  an unsharded model, so the loss normalisation is the same in both;
- every rank runs the same number of forward and backward passes (FSDP's gathers are
  collectives): a rank with fewer micro-batches runs empty ones (`pad_micro_batches`);
- the adapter the sampler gets, and a checkpoint's, is gathered in full first
  (`full_state_dict`, a collective every rank calls; the result is on rank 0).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

__all__ = ["full_state_dict", "is_sharded", "pad_micro_batches", "shard"]


def shard(model: torch.nn.Module, *, layer_suffix: str = "DecoderLayer") -> torch.nn.Module:
    """Shard ``model`` over the default process group (FSDP2), layer by layer, in place.

    Modules whose class name ends with ``layer_suffix`` become units of their own (a
    transformers decoder layer: ``LlamaDecoderLayer`` ...); the rest forms the root unit.
    Gradients are summed across ranks, not averaged. Returns ``model``.
    """
    from torch.distributed.fsdp import FSDPModule, fully_shard

    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError("shard() needs torch.distributed initialised (run under torchrun)")
    layers = [m for m in model.modules() if type(m).__name__.endswith(layer_suffix)]
    for layer in layers:
        fully_shard(layer)
    fully_shard(model)
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)  # gloo has no PREMUL_SUM
    return model


def is_sharded(model: torch.nn.Module) -> bool:
    """Whether ``model`` is sharded with FSDP2 (`shard`)."""
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def pad_micro_batches(count: int, device: torch.device) -> int:
    """The most micro-batches any rank runs this step (every rank must call it)."""
    total = torch.tensor([count], dtype=torch.int64, device=device)
    dist.all_reduce(total, op=dist.ReduceOp.MAX)
    return int(total.item())


def full_state_dict(model: torch.nn.Module, *, trainable_only: bool = False) -> dict[str, Any]:
    """The whole model's state dict on rank 0 (CPU tensors), empty on the others: a
    collective every rank must call. For ``LoraSync.sync(model, state_dict=...)`` and
    checkpoints of a sharded model; ``trainable_only`` leaves the frozen base weights out
    (a LoRA adapter is all the sampler needs)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    options = StateDictOptions(
        full_state_dict=True, cpu_offload=True, ignore_frozen_params=trainable_only
    )
    return get_model_state_dict(model, options=options)
