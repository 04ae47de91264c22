"""The reference trainer's learner: processes, the policy, its optimizer, how it is sharded.

- ``setup_processes``: one process, or a process group under ``torchrun`` (NCCL when the
  learner is on a GPU, gloo on a CPU; ``--nnodes`` for several machines);
- ``build_policy``: the base model (``dtype``) with a fresh LoRA adapter, the same weights
  on every rank (``build_model``), and its tokenizer (``load_tokenizer``);
- ``prepare``: after version 0 is published, the policy sharded over the ranks (``fsdp``,
  FSDP2), Adam over its LoRA weights, and on ``--resume`` the checkpoint's optimizer state;
- ``adapter_state``: what ``LoraSync`` saves, gathered in full first when the policy is
  sharded (every rank calls it);
- ``Setup``: what every step uses besides the model and the optimizer.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias

import attrs

from nemogym_sdk import SamplingParams
from nemogym_sdk.errors import ConfigError
from nemogym_sdk.train.config import TrainConfig

if TYPE_CHECKING:  # torch, peft and transformers load when a run builds its policy
    import torch
    from peft import PeftModel
    from torch.optim import Optimizer
    from transformers import PreTrainedTokenizerBase

    from nemogym_sdk.adapters.torch import PolicyLoss

    Tokenizer: TypeAlias = PreTrainedTokenizerBase
    AdapterState: TypeAlias = dict[str, torch.Tensor] | None
    """The full adapter state of a sharded policy (rank 0), or None: ``LoraSync`` saves the
    model's own."""

__all__ = [
    "Setup",
    "adam",
    "adapter_state",
    "build_model",
    "build_policy",
    "load_tokenizer",
    "prepare",
    "setup_processes",
]


def setup_processes(device: str) -> tuple[int, int]:
    """(rank, world size); a process group when torchrun started several (NCCL for a learner
    on ``cuda``, gloo on the CPU)."""
    import torch
    import torch.distributed as dist

    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        backend = "nccl" if device.startswith("cuda") else "gloo"
        if backend == "nccl":
            torch.cuda.set_device(torch.device(device))
        dist.init_process_group(backend)
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def build_policy(config: TrainConfig, device: str = "cpu") -> tuple[PeftModel, Tokenizer]:
    """(the base model with a fresh LoRA adapter, on ``device``, its tokenizer): `build_model`
    and `load_tokenizer`."""
    return build_model(config, device), load_tokenizer(config)


def load_tokenizer(config: TrainConfig) -> Tokenizer:
    """The policy's tokenizer: the tiny model's, or the model directory's (quick: a run
    checks its rows' lengths with it before it starts anything)."""
    path = config.model_dir()
    if path is None:
        from nemogym_sdk.serve.tiny import build_tiny_tokenizer

        return build_tiny_tokenizer()
    from transformers import AutoTokenizer

    tokenizer: Tokenizer = AutoTokenizer.from_pretrained(path)
    return tokenizer


def build_model(config: TrainConfig, device: str = "cpu") -> PeftModel:
    """The base model with a fresh LoRA adapter, on ``device``; the same weights on every
    rank (built or loaded on the CPU in float32, then moved, in ``dtype``; the LoRA weights
    stay float32)."""
    import torch
    from peft import LoraConfig, PeftModel, get_peft_model

    from nemogym_sdk.serve.tiny import seeded_rng

    base: Any
    path = config.model_dir()
    if path is None:
        from nemogym_sdk.serve.tiny import build_tiny_model

        base = build_tiny_model(config.seed)
    else:
        from transformers import AutoModelForCausalLM

        base = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    lora = LoraConfig(
        r=config.lora_rank,
        lora_alpha=2 * config.lora_rank,
        target_modules="all-linear",
        lora_dropout=0.0,  # dropout would make the learner's logprobs differ from the sampler's
    )
    # peft draws LoRA's A from the global RNG: seeded, the same on all ranks (left seeded)
    with seeded_rng(config.seed, restore=False), warnings.catch_warnings():
        warnings.filterwarnings("ignore", ".*is_gradient_checkpointing", FutureWarning)
        dtype = torch.bfloat16 if config.dtype == "bfloat16" else torch.float32
        policy = get_peft_model(base.to(device=device, dtype=dtype), lora)
    assert isinstance(policy, PeftModel)  # no mixed-adapter model: one adapter, one type
    return policy


@attrs.frozen(kw_only=True)
class Setup:
    """What every step of a run uses besides the model and the optimizer."""

    config: TrainConfig
    """The run's configuration."""
    device: str
    """Where the learner runs (``resolve_device``)."""
    sampling: SamplingParams
    """How the rollouts are sampled: forced onto every row by ``AgentClient`` and used by
    ``train_step`` for the learner's logprobs (one record, so the two cannot differ)."""
    loss: PolicyLoss
    """The policy loss."""
    pad: int
    """The padding token id."""

    @classmethod
    def of(cls, config: TrainConfig, device: str, tokenizer: Tokenizer) -> Setup:
        from nemogym_sdk.adapters.torch import PolicyLoss

        eos = int(tokenizer.eos_token_id)
        return cls(
            config=config,
            device=device,
            sampling=SamplingParams(temperature=config.temperature),
            loss=PolicyLoss(
                loss_type=config.loss,
                max_completion_length=config.max_completion_length,
                importance_sampling=config.importance_sampling,
                is_cap=config.is_cap,
                is_floor=config.is_floor,
            ),
            pad=int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos),
        )


def adam(model: PeftModel, config: TrainConfig) -> Optimizer:
    """Adam over the trainable (LoRA) parameters."""
    import torch

    return torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=config.lr)


def prepare(
    model: PeftModel, config: TrainConfig, checkpoint: Path | None, world: int
) -> Optimizer:
    """The optimizer, once the first version is published: the policy sharded first
    (``fsdp``), the optimizer state of ``checkpoint`` (``--resume``) loaded."""
    if config.fsdp:
        from nemogym_sdk.adapters.torch.sharding import shard

        if world < 2:
            raise ConfigError(
                "--fsdp shards the learner over torchrun's ranks: run it under torchrun"
            )
        shard(model)
    optimizer = adam(model, config)
    if checkpoint is not None:
        from nemogym_sdk.train.checkpoints import load_optimizer_checkpoint

        load_optimizer_checkpoint(model, optimizer, checkpoint)
    return optimizer


def adapter_state(model: PeftModel) -> AdapterState:
    """The full adapter state for ``LoraSync.sync(model, state_dict=...)`` when the policy is
    sharded (a collective: every rank calls it; rank 0 gets it), else None."""
    from nemogym_sdk.lora._adapter import gather_adapter

    return gather_adapter(model)
