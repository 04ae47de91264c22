"""GRPO on a plain PyTorch model: per-token logprobs, policy losses and one training step.

The pieces a hand-written loop needs after ``collate`` and ``compute_advantages``::

    from nemogym_sdk.adapters.torch import PolicyLoss, train_step

    batch = collate(rollouts, pad_token_id=tokenizer.pad_token_id)
    advantages = compute_advantages(batch)                        # nemogym_sdk.grpo (numpy)
    metrics = train_step(model, optimizer, batch, advantages,
                         sampling=client.sampling, loss=PolicyLoss(loss_type="dapo"))
    metrics.mismatch_max  # how far the learner's logprobs are from the sampler's

- `token_logprobs`: the model's logprob of every completion token of a ``Batch`` (prompt and
  completion in one forward, padding respected, chunked over rows), after the temperature and
  top-p of the ``SamplingParams`` the rollouts were played with.
- `PolicyLoss` and `policy_loss`: ``grpo``, ``dapo``, ``dr_grpo`` and ``gspo`` with
  ``epsilon``/``epsilon_high`` clipping, importance-sampling correction against the sampling
  logprobs and an optional KL penalty; the loss mask is ``Batch.loss_mask``. ``PolicyLoss``,
  ``LossType`` and ``ImportanceSampling`` live in ``nemogym_sdk.grpo`` (torch-free) and are
  re-exported here.
- `train_step`: micro-batches with gradient accumulation, gradients all-reduced across ranks
  when ``torch.distributed`` is initialised, one optimizer step, and `StepMetrics`.
- `all_gather_array`: the ``gather`` hook of ``compute_advantages`` under ``torchrun``, so
  ``scale="batch"`` and GDPO's batch normalisation span every rank's batch.

Only this package imports torch; ``import nemogym_sdk`` never does.
"""

from __future__ import annotations

try:
    import torch  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the environment
    from nemogym_sdk import _extras

    absent = _extras.missing(("torch", "peft")) or ["torch"]
    raise ImportError(_extras.needs("nemogym_sdk.adapters.torch", absent, "torch")) from exc

from nemogym_sdk.adapters.torch._dist import all_gather_array
from nemogym_sdk.adapters.torch.logprobs import learner_processing, token_logprobs
from nemogym_sdk.adapters.torch.losses import (
    ImportanceSampling,
    LossTerms,
    LossType,
    PolicyLoss,
    episode_tokens,
    loss_normalizer,
    policy_loss,
    policy_loss_terms,
    policy_span,
)
from nemogym_sdk.adapters.torch.step import StepMetrics, train_step

__all__ = [
    "ImportanceSampling",
    "LossTerms",
    "LossType",
    "PolicyLoss",
    "StepMetrics",
    "all_gather_array",
    "episode_tokens",
    "learner_processing",
    "loss_normalizer",
    "policy_loss",
    "policy_loss_terms",
    "policy_span",
    "token_logprobs",
    "train_step",
]
