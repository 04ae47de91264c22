"""GRPO-family policy losses over per-token logprobs, with clipping, IS correction and KL.

Notation, per row ``i`` and policy token ``t`` (``m_it`` = loss mask = ``completion_mask *
env_mask``, so tool and environment tokens never carry gradient; ``|o_i| = sum_t m_it``):

    r_it  = exp(logp_it - old_it)                  ratio to the policy that produced the batch
    l_it  = -min(r_it * A_i, clip(r_it, 1 - eps, 1 + eps_high) * A_i) * w_it + beta * kl_it
    w_it  = importance weight exp(old_it - sampler_it) against the sampler's logprobs,
            truncated at ``is_cap`` ("truncate") or set to 0 beyond it ("mask"); 1 with "none"
    kl_it = exp(ref_it - logp_it) - (ref_it - logp_it) - 1   (k3 estimator, >= 0)

``old`` is the learner's own logprob before the update (on-policy: ``logp.detach()``, so
``r = 1`` with gradient ``grad logp``), and ``w`` corrects for the sampler having drawn the tokens
from a slightly different distribution (other kernels, a stale adapter, processing). How the
token terms become one loss:

    grpo     mean over rows of (mean over the row's policy tokens)     normaliser: rows
    dapo     sum over all policy tokens / number of policy tokens      normaliser: tokens
    dr_grpo  sum over all policy tokens / (rows * max_completion_length)
    gspo     sequence ratio s_i = exp(mean_t (logp_it - old_it)), per row
             -min(s_i A_i, clip(s_i) A_i) * w_i + beta * mean_t kl_it, mean over rows;
             w_i = exp(mean_t log w_it) is the sequence-level (geometric mean) IS weight

Rows count when they have at least one policy token. With gradient accumulation or several
ranks the normaliser is the whole batch's (`loss_normalizer`), so micro-batches add up to
exactly the full-batch loss. Which sampler logprobs each loss expects: those of the
distribution the sampler drew from (``processed_logprobs`` in vLLM and `nemogym_sdk.serve`),
with the learner's logprobs computed under the same temperature / top-k / top-p.
"""

from __future__ import annotations

import math
from typing import Literal

import attrs
import torch

from nemogym_sdk.errors import ConfigError

__all__ = [
    "ImportanceSampling",
    "LossTerms",
    "LossType",
    "PolicyLoss",
    "loss_normalizer",
    "policy_loss",
    "policy_loss_terms",
]

LossType = Literal["grpo", "dapo", "dr_grpo", "gspo"]
ImportanceSampling = Literal["truncate", "mask", "none"]
_LOSS_TYPES = ("grpo", "dapo", "dr_grpo", "gspo")
_IS_MODES = ("truncate", "mask", "none")


@attrs.frozen(kw_only=True)
class PolicyLoss:
    """Which policy loss to compute and its knobs (TRL's names where they exist)."""

    loss_type: LossType = "dapo"
    """``grpo`` (per-row mean), ``dapo`` (token mean), ``dr_grpo`` (constant normaliser) or
    ``gspo`` (sequence-level ratio; use small epsilons, e.g. 3e-4 / 4e-4)."""
    epsilon: float = 0.2
    """Lower clipping range: ratios below ``1 - epsilon`` are clipped."""
    epsilon_high: float | None = None
    """Upper clipping range (DAPO's clip-higher, e.g. 0.28); None = ``epsilon``."""
    importance_sampling: ImportanceSampling = "truncate"
    """Correction against the sampling logprobs: ``truncate`` the weight at ``is_cap``, ``mask``
    tokens whose weight leaves ``[is_floor, is_cap]``, or ``none``."""
    is_cap: float = 3.0
    """Largest importance weight kept (TRL's ``vllm_importance_sampling_cap`` default)."""
    is_floor: float | None = None
    """``mask`` mode only: weights below this are masked too."""
    beta: float = 0.0
    """KL penalty coefficient to a reference model (0: no reference needed)."""
    max_completion_length: int | None = None
    """``dr_grpo``'s constant (set it to the sampler's limit, as Dr. GRPO does); None = the
    batch's longest completion."""
    mask_truncated: bool = False
    """Leave completions cut at ``max_completion_length`` out of the loss (DAPO's overlong
    filtering)."""

    def __attrs_post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise ``ConfigError`` for an unknown loss type or an out-of-range knob."""
        if self.loss_type not in _LOSS_TYPES:
            raise ConfigError(f"loss_type must be one of {_LOSS_TYPES}, got {self.loss_type!r}")
        if self.importance_sampling not in _IS_MODES:
            raise ConfigError(
                f"importance_sampling must be one of {_IS_MODES}, got {self.importance_sampling!r}"
            )
        if not 0 <= self.epsilon < 1 or (self.epsilon_high is not None and self.epsilon_high < 0):
            raise ConfigError(
                f"need 0 <= epsilon < 1 and epsilon_high >= 0, got {self.epsilon}, "
                f"{self.epsilon_high}"
            )
        if not self.is_cap > 0 or (self.is_floor is not None and not self.is_floor >= 0):
            raise ConfigError(f"need is_cap > 0 and is_floor >= 0, got {self.is_cap}")
        if self.beta < 0:
            raise ConfigError(f"beta must be >= 0, got {self.beta}")
        if self.max_completion_length is not None and self.max_completion_length < 1:
            raise ConfigError("max_completion_length must be >= 1")

    @property
    def upper(self) -> float:
        """``1 + epsilon_high`` (or ``1 + epsilon``)."""
        return 1.0 + (self.epsilon if self.epsilon_high is None else self.epsilon_high)

    @property
    def lower(self) -> float:
        """``1 - epsilon``."""
        return 1.0 - self.epsilon


@attrs.frozen(kw_only=True)
class LossTerms:
    """Sums over some rows, to be divided by the whole batch's normaliser.

    Dividing ``objective`` by `loss_normalizer` gives the loss; summing the terms of every
    micro-batch (and rank) first gives exactly the full-batch loss and gradient.
    """

    objective: torch.Tensor
    """Scalar with gradient: policy term plus ``beta`` times the KL term, un-normalised."""
    policy: torch.Tensor
    """Scalar, detached: the policy term alone, un-normalised."""
    kl_sum: torch.Tensor
    """Scalar, detached: sum of ``kl_it`` over policy tokens (0 without a reference)."""
    tokens: torch.Tensor
    """Scalar: number of policy tokens."""
    rows: torch.Tensor
    """Scalar: number of rows with at least one policy token."""
    clipped: torch.Tensor
    """Scalar: tokens (rows for gspo) whose clipped term was the one taken."""
    is_weight_sum: torch.Tensor
    """Scalar: sum of the importance weights over policy tokens (rows for gspo)."""
    is_limited: torch.Tensor
    """Scalar: tokens (rows for gspo) whose weight was truncated or masked."""
    mismatch_abs_sum: torch.Tensor
    """Scalar: sum over policy tokens of ``|logp - sampler|`` (learner vs sampler logprob)."""
    mismatch_abs_max: torch.Tensor
    """Scalar: largest ``|logp - sampler|`` over policy tokens (0 when there are none)."""
    mismatch_kl_sum: torch.Tensor
    """Scalar: sum of ``exp(d) - d - 1`` with ``d = sampler - logp`` (k3 of the mismatch)."""


def loss_normalizer(
    loss: PolicyLoss, tokens: float, rows: float, completion_length: int | None = None
) -> float:
    """The whole batch's normaliser for ``loss.loss_type`` (see the module docstring).

    ``tokens`` and ``rows`` count policy tokens and rows with any, over every micro-batch and
    rank; ``completion_length`` is the longest completion (``dr_grpo`` without a configured
    length).
    """
    if loss.loss_type == "dapo":
        return float(tokens)
    if loss.loss_type == "dr_grpo":
        length = loss.max_completion_length or completion_length
        if length is None:
            raise ConfigError("dr_grpo needs max_completion_length or the batch's length")
        return float(rows) * float(length)
    return float(rows)


def policy_loss_terms(
    logprobs_BT: torch.Tensor,
    advantages_B: torch.Tensor,
    loss_mask_BT: torch.Tensor,
    loss: PolicyLoss,
    *,
    old_logprobs_BT: torch.Tensor | None = None,
    sampler_logprobs_BT: torch.Tensor | None = None,
    ref_logprobs_BT: torch.Tensor | None = None,
) -> LossTerms:
    """The un-normalised loss terms of some rows (see the module docstring for the formulas).

    ``logprobs_BT`` carries the gradient; ``old_logprobs_BT`` defaults to ``logprobs_BT``
    detached (on-policy); without ``sampler_logprobs_BT`` there is no IS correction and no
    mismatch; ``ref_logprobs_BT`` is needed when ``loss.beta > 0``.
    """
    mask_BT = loss_mask_BT.bool()
    zeros_BT = torch.zeros_like(logprobs_BT)
    current_BT = logprobs_BT.detach()
    old_BT = current_BT if old_logprobs_BT is None else old_logprobs_BT.detach().float()
    tokens_B = mask_BT.sum(dim=1)
    live_B = tokens_B > 0
    advantages_B1 = advantages_B.detach().float().unsqueeze(1)

    # Importance weights against the sampler, and the learner-vs-sampler mismatch.
    weights_BT = torch.ones_like(current_BT)
    mismatch_BT = zeros_BT
    if sampler_logprobs_BT is not None:
        sampler_BT = sampler_logprobs_BT.detach().float()
        mismatch_BT = torch.where(mask_BT, current_BT - sampler_BT, zeros_BT)
        log_weights_BT = torch.where(mask_BT, old_BT - sampler_BT, zeros_BT)
    else:
        log_weights_BT = zeros_BT

    if ref_logprobs_BT is not None:
        ref_delta_BT = torch.where(
            mask_BT, ref_logprobs_BT.detach().float() - logprobs_BT, zeros_BT
        )
        kl_BT = torch.exp(ref_delta_BT) - ref_delta_BT - 1.0
    elif loss.beta > 0:
        raise ConfigError("beta > 0 needs reference logprobs (a reference model)")
    else:
        kl_BT = zeros_BT

    log_ratio_BT = torch.where(mask_BT, logprobs_BT - old_BT, zeros_BT)
    if loss.loss_type == "gspo":
        denominator_B = tokens_B.clamp(min=1).to(logprobs_BT.dtype)
        seq_ratio_B = torch.exp(log_ratio_BT.sum(dim=1) / denominator_B)
        seq_weight_B, seq_limited_B = _limit(
            torch.exp(log_weights_BT.sum(dim=1) / denominator_B), loss, sampler_logprobs_BT
        )
        adv_B = advantages_B1.squeeze(1)
        unclipped_B = seq_ratio_B * adv_B
        clipped_B = seq_ratio_B.clamp(loss.lower, loss.upper) * adv_B
        policy_B = -torch.minimum(unclipped_B, clipped_B) * seq_weight_B
        kl_mean_B = (kl_BT * mask_BT).sum(dim=1) / denominator_B
        live = live_B.to(policy_B.dtype)
        policy = (policy_B * live).sum()
        objective = policy + loss.beta * (kl_mean_B * live).sum()
        clipped = ((clipped_B < unclipped_B) & live_B).sum()
        is_weight_sum = (seq_weight_B * live).sum()
        is_limited = (seq_limited_B & live_B).sum()
    else:
        token_weights_BT, limited_BT = _limit(torch.exp(log_weights_BT), loss, sampler_logprobs_BT)
        weights_BT = token_weights_BT
        ratio_BT = torch.exp(log_ratio_BT)
        unclipped_BT = ratio_BT * advantages_B1
        clipped_BT = ratio_BT.clamp(loss.lower, loss.upper) * advantages_B1
        policy_BT = -torch.minimum(unclipped_BT, clipped_BT) * weights_BT
        policy_BT = torch.where(mask_BT, policy_BT, zeros_BT)
        total_BT = policy_BT + loss.beta * torch.where(mask_BT, kl_BT, zeros_BT)
        if loss.loss_type == "grpo":
            per_row_B = tokens_B.clamp(min=1).to(logprobs_BT.dtype)
            policy = (policy_BT.sum(dim=1) / per_row_B).sum()
            objective = (total_BT.sum(dim=1) / per_row_B).sum()
        else:
            policy = policy_BT.sum()
            objective = total_BT.sum()
        clipped = ((clipped_BT < unclipped_BT) & mask_BT).sum()
        is_weight_sum = torch.where(mask_BT, weights_BT, zeros_BT).sum()
        is_limited = (limited_BT & mask_BT).sum()

    abs_mismatch_BT = mismatch_BT.abs()
    return LossTerms(
        objective=objective,
        policy=policy.detach(),
        kl_sum=torch.where(mask_BT, kl_BT, zeros_BT).sum().detach(),
        tokens=tokens_B.sum(),
        rows=live_B.sum(),
        clipped=clipped,
        is_weight_sum=is_weight_sum.detach(),
        is_limited=is_limited,
        mismatch_abs_sum=abs_mismatch_BT.sum(),
        mismatch_abs_max=abs_mismatch_BT.max() if abs_mismatch_BT.numel() else zeros_BT.sum(),
        mismatch_kl_sum=torch.where(
            mask_BT, torch.exp(-mismatch_BT) + mismatch_BT - 1.0, zeros_BT
        ).sum(),
    )


def policy_loss(
    logprobs_BT: torch.Tensor,
    advantages_B: torch.Tensor,
    loss_mask_BT: torch.Tensor,
    loss: PolicyLoss,
    *,
    old_logprobs_BT: torch.Tensor | None = None,
    sampler_logprobs_BT: torch.Tensor | None = None,
    ref_logprobs_BT: torch.Tensor | None = None,
) -> torch.Tensor:
    """The loss of one whole batch (normalised over these rows): a scalar with gradient.

    For micro-batches, use `policy_loss_terms` and divide by the whole batch's
    `loss_normalizer` (what `train_step` does). A batch without policy tokens gives 0.
    ``dr_grpo`` without ``max_completion_length`` divides by the tensors' width ``T``.
    """
    terms = policy_loss_terms(
        logprobs_BT,
        advantages_B,
        loss_mask_BT,
        loss,
        old_logprobs_BT=old_logprobs_BT,
        sampler_logprobs_BT=sampler_logprobs_BT,
        ref_logprobs_BT=ref_logprobs_BT,
    )
    longest = int(loss_mask_BT.shape[1])
    normalizer = loss_normalizer(loss, float(terms.tokens), float(terms.rows), longest)
    return terms.objective / normalizer if normalizer else terms.objective * 0.0


def _limit(
    weights: torch.Tensor, loss: PolicyLoss, sampler: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Apply the IS mode to raw weights; returns (weights, which were truncated or masked)."""
    if sampler is None or loss.importance_sampling == "none":
        return torch.ones_like(weights), torch.zeros_like(weights, dtype=torch.bool)
    over = weights > loss.is_cap
    if loss.importance_sampling == "truncate":
        return weights.clamp(max=loss.is_cap), over
    floor = loss.is_floor if loss.is_floor is not None else -math.inf
    outside = over | (weights < floor)
    return torch.where(outside, torch.zeros_like(weights), weights), outside
