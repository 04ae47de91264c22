"""GRPO on a plain PyTorch model: per-token logprobs, policy losses and one training step.

The pieces a hand-written loop needs after ``collate`` and ``compute_advantages``::

    from nemogym_sdk.adapters.torch import PolicyLoss, train_step

    batch = collate(rollouts, pad_token_id=tokenizer.pad_token_id)
    advantages = compute_advantages(batch)                        # nemogym_sdk.grpo (numpy)
    metrics = train_step(model, optimizer, batch, advantages,
                         loss=PolicyLoss(loss_type="dapo"), temperature=1.0)
    metrics.mismatch_max  # how far the learner's logprobs are from the sampler's

- `token_logprobs`: the model's logprob of every completion token of a ``Batch`` (prompt and
  completion in one forward, padding respected, chunked over rows), after the same temperature /
  top-k / top-p processing the sampler applied (`nemogym_sdk.serve.sampling.process_logits`).
- `PolicyLoss` and `policy_loss`: ``grpo``, ``dapo``, ``dr_grpo`` and ``gspo`` with
  ``epsilon``/``epsilon_high`` clipping, importance-sampling correction against the sampling
  logprobs and an optional KL penalty; the loss mask is ``completion_mask * env_mask``.
- `train_step`: micro-batches with gradient accumulation, gradients all-reduced across ranks
  when ``torch.distributed`` is initialised, one optimizer step, and `StepMetrics`.

Only this package imports torch; ``import nemogym_sdk`` never does.
"""

from __future__ import annotations

try:
    import torch  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "nemogym_sdk.adapters.torch needs PyTorch and peft: pip install 'nemogym-sdk[torch]' "
        "(on a CPU-only machine install the CPU build first: pip install torch==2.13.0)"
    ) from exc

from nemogym_sdk.adapters.torch.logprobs import token_logprobs
from nemogym_sdk.adapters.torch.losses import (
    ImportanceSampling,
    LossTerms,
    LossType,
    PolicyLoss,
    loss_normalizer,
    policy_loss,
    policy_loss_terms,
)
from nemogym_sdk.adapters.torch.step import StepMetrics, train_step

__all__ = [
    "ImportanceSampling",
    "LossTerms",
    "LossType",
    "PolicyLoss",
    "StepMetrics",
    "loss_normalizer",
    "policy_loss",
    "policy_loss_terms",
    "token_logprobs",
    "train_step",
]
