"""GRPO-family policy losses over per-token logprobs, with clipping, IS correction and KL.

Notation, per row ``i`` and policy token ``t`` (``m_it`` = loss mask = ``completion_mask *
env_mask``, so tool and environment tokens never carry gradient; ``|o_i| = sum_t m_it``):

    r_it  = exp(logp_it - old_it)                  ratio to the policy that produced the batch
    l_it  = -min(r_it * A_i, clip(r_it, 1 - eps, 1 + eps_high) * A_i) * w_it + beta * kl_it
    w_it  = importance weight exp(old_it - sampler_it) against the sampler's logprobs,
            clamped into [is_floor, is_cap] ("truncate") or set to 0 outside it ("mask");
            1 with "none"
    kl_it = exp(ref_it - logp_it) - (ref_it - logp_it) - 1   (k3 estimator, >= 0)

``old`` is the learner's own logprob before the update (on-policy: ``logp.detach()``, so
``r = 1`` with gradient ``grad logp``), and ``w`` corrects for the sampler having drawn the tokens
from a slightly different distribution (other kernels, a stale adapter, processing). How the
token terms become one loss:

    grpo     mean over rows of (mean over the row's policy tokens)     normaliser: rows
    dapo     sum over all policy tokens / number of policy tokens      normaliser: tokens
    dr_grpo  sum over all policy tokens / (rows * L), L = max_completion_length, or else
             the batch's policy span (`policy_span`: 1 + the last position holding a policy
             token in any row; never the padded width, so padding cannot change the loss)
    gspo     sequence ratio s_i = exp(mean_t (logp_it - old_it)), per row
             -min(s_i A_i, clip(s_i) A_i) * w_i + beta * mean_t kl_it, mean over rows;
             w_i = exp(mean_t log w_it) is the sequence-level (geometric mean) IS weight

Rows count when they have at least one policy token. An episode that forked (a template
that rewrote its history, ``DriftPolicy.FORK``) is several rows, its traces, and still counts
once: ``|o_i|`` above is the episode's policy tokens over all its traces, each trace counts
as its share of them in "rows", and gspo weighs each trace's sequence term by that share. An
episode's tokens are then trained exactly once with the weight they would have unforked.
With gradient accumulation or several
ranks the normaliser is the whole batch's (`loss_normalizer`), so micro-batches add up to
exactly the full-batch loss. Everything is computed in at least float32: logprobs of a bf16
model are cast up before any arithmetic. Which sampler logprobs each loss expects: those of
the distribution the sampler drew from (``processed_logprobs`` in vLLM and
`nemogym_sdk.serve`), with the learner's logprobs computed under the same ``SamplingParams``.
"""

from __future__ import annotations

import attrs
import torch

from nemogym_sdk.errors import ConfigError
from nemogym_sdk.grpo.loss import ImportanceSampling, LossType, PolicyLoss

__all__ = [
    "ImportanceSampling",
    "LossTerms",
    "LossType",
    "PolicyLoss",
    "episode_tokens",
    "loss_normalizer",
    "policy_loss",
    "policy_loss_terms",
    "policy_span",
]


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
    episodes: torch.Tensor
    """Scalar: the episodes those rows are, each row counted as its share of its episode's
    policy tokens (equal to ``rows`` when no episode forked)."""
    clipped: torch.Tensor
    """Scalar: tokens (rows for gspo) whose clipped term was the one taken."""
    is_weight_sum: torch.Tensor
    """Scalar: sum of the importance weights over policy tokens (rows for gspo)."""
    is_limited: torch.Tensor
    """Scalar: tokens (rows for gspo) whose weight was outside ``[is_floor, is_cap]``, so
    truncated or masked."""
    mismatch_abs_sum: torch.Tensor
    """Scalar: sum over policy tokens of ``|logp - sampler|`` (learner vs sampler logprob)."""
    mismatch_abs_max: torch.Tensor
    """Scalar: largest ``|logp - sampler|`` over policy tokens (0 when there are none)."""
    mismatch_kl_sum: torch.Tensor
    """Scalar: sum of ``exp(d) - d - 1`` with ``d = sampler - logp`` (k3 of the mismatch)."""


def policy_span(loss_mask_BT: torch.Tensor) -> int:
    """1 + the last position that holds a policy token in any row (0 when none does).

    ``dr_grpo``'s length when ``max_completion_length`` is unset: the longest completion in
    the loss, measured up to its last policy token. Padding, trailing environment tokens
    and rows left out of the loss (their mask is 0) do not change it.
    """
    mask_BT = loss_mask_BT.bool()
    if mask_BT.numel() == 0:
        return 0
    positions_T = torch.arange(1, mask_BT.shape[1] + 1, device=mask_BT.device)
    return int((mask_BT * positions_T).max())


def episode_tokens(episode_index_B: torch.Tensor, loss_mask_BT: torch.Tensor) -> torch.Tensor:
    """``[B]`` the policy tokens of each row's episode over all its rows (``Batch.
    episode_index``: a rollout and its forks share one), for ``episode_tokens_B``."""
    tokens_B = loss_mask_BT.bool().sum(dim=1)
    index_B = episode_index_B.to(device=tokens_B.device, dtype=torch.long)
    if index_B.numel() == 0:
        return tokens_B
    per_episode = torch.zeros(int(index_B.max()) + 1, dtype=tokens_B.dtype, device=tokens_B.device)
    return per_episode.index_add_(0, index_B, tokens_B)[index_B]


def loss_normalizer(
    loss: PolicyLoss, tokens: float, rows: float, completion_length: int | None = None
) -> float:
    """The whole batch's normaliser for ``loss.loss_type`` (see the module docstring).

    ``tokens`` and ``rows`` count policy tokens and the episodes with any (``LossTerms.
    episodes``: rows, a forked episode's rows counting once), over every micro-batch and
    rank; ``completion_length`` is the batch's `policy_span` (``dr_grpo`` without a
    configured ``max_completion_length``).
    """
    if loss.loss_type is LossType.DAPO:
        return float(tokens)
    if loss.loss_type is LossType.DR_GRPO:
        length = loss.max_completion_length or completion_length
        if length is None:
            raise ConfigError("dr_grpo needs max_completion_length or the batch's policy span")
        return float(rows) * float(length)
    return float(rows)


@attrs.frozen(kw_only=True)
class _Tokens:
    """The per-token tensors every loss type reads."""

    mask: torch.Tensor
    """``[B, T]`` bool, the loss mask."""
    zeros: torch.Tensor
    """``[B, T]`` zeros in the computation's dtype."""
    tokens: torch.Tensor
    """``[B]`` policy tokens per row."""
    episode_tokens: torch.Tensor
    """``[B]`` policy tokens of the row's episode, over all its rows (its traces)."""
    share: torch.Tensor
    """``[B]`` the row's share of its episode's policy tokens (1 when it did not fork)."""
    live: torch.Tensor
    """``[B]`` the row has a policy token."""
    advantages: torch.Tensor
    """``[B]`` advantages, detached."""
    log_ratio: torch.Tensor
    """``[B, T]`` ``logp - old`` on policy tokens (with gradient), 0 elsewhere."""
    log_weights: torch.Tensor
    """``[B, T]`` ``old - sampler`` on policy tokens, 0 elsewhere (or without a sampler)."""
    kl: torch.Tensor
    """``[B, T]`` k3 KL to the reference (0 without one)."""
    corrected: bool
    """Whether sampler logprobs were given (otherwise no IS weights)."""


@attrs.frozen(kw_only=True)
class _Policy:
    """The policy part of some rows' terms."""

    objective: torch.Tensor
    policy: torch.Tensor
    clipped: torch.Tensor
    is_weight_sum: torch.Tensor
    is_limited: torch.Tensor


def _limit(
    weights: torch.Tensor, loss: PolicyLoss, corrected: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Apply the IS mode to raw weights; returns (weights, which were outside the bounds)."""
    if not corrected or loss.importance_sampling is ImportanceSampling.NONE:
        return torch.ones_like(weights), torch.zeros_like(weights, dtype=torch.bool)
    outside = weights > loss.is_cap
    if loss.is_floor is not None:
        outside = outside | (weights < loss.is_floor)
    if loss.importance_sampling is ImportanceSampling.TRUNCATE:
        return weights.clamp(min=loss.is_floor, max=loss.is_cap), outside
    return torch.where(outside, torch.zeros_like(weights), weights), outside


def _gspo(t: _Tokens, loss: PolicyLoss) -> _Policy:
    """One clipped sequence ratio and one IS weight (geometric mean) per row."""
    denominator_B = t.tokens.clamp(min=1).to(t.log_ratio.dtype)
    seq_ratio_B = torch.exp(t.log_ratio.sum(dim=1) / denominator_B)
    seq_weight_B, seq_limited_B = _limit(
        torch.exp(t.log_weights.sum(dim=1) / denominator_B), loss, t.corrected
    )
    unclipped_B = seq_ratio_B * t.advantages
    clipped_B = seq_ratio_B.clamp(loss.lower, loss.upper) * t.advantages
    policy_B = -torch.minimum(unclipped_B, clipped_B) * seq_weight_B
    kl_mean_B = (t.kl * t.mask).sum(dim=1) / denominator_B
    live = t.live.to(policy_B.dtype)
    counted = live * t.share  # a trace counts as its share of its episode
    policy = (policy_B * counted).sum()
    return _Policy(
        objective=policy + loss.beta * (kl_mean_B * counted).sum(),
        policy=policy,
        clipped=((clipped_B < unclipped_B) & t.live).sum(),
        is_weight_sum=(seq_weight_B * live).sum(),
        is_limited=(seq_limited_B & t.live).sum(),
    )


def _per_token(t: _Tokens, loss: PolicyLoss) -> _Policy:
    """Clipped token ratios and token IS weights; grpo averages each row first."""
    weights_BT, limited_BT = _limit(torch.exp(t.log_weights), loss, t.corrected)
    ratio_BT = torch.exp(t.log_ratio)
    advantages_B1 = t.advantages.unsqueeze(1)
    unclipped_BT = ratio_BT * advantages_B1
    clipped_BT = ratio_BT.clamp(loss.lower, loss.upper) * advantages_B1
    policy_BT = -torch.minimum(unclipped_BT, clipped_BT) * weights_BT
    policy_BT = torch.where(t.mask, policy_BT, t.zeros)
    total_BT = policy_BT + loss.beta * torch.where(t.mask, t.kl, t.zeros)
    if loss.loss_type is LossType.GRPO:
        per_row_B = t.episode_tokens.clamp(min=1).to(policy_BT.dtype)  # the episode's mean
        policy = (policy_BT.sum(dim=1) / per_row_B).sum()
        objective = (total_BT.sum(dim=1) / per_row_B).sum()
    else:
        policy, objective = policy_BT.sum(), total_BT.sum()
    return _Policy(
        objective=objective,
        policy=policy,
        clipped=((clipped_BT < unclipped_BT) & t.mask).sum(),
        is_weight_sum=torch.where(t.mask, weights_BT, t.zeros).sum(),
        is_limited=(limited_BT & t.mask).sum(),
    )


def policy_loss_terms(
    logprobs_BT: torch.Tensor,
    advantages_B: torch.Tensor,
    loss_mask_BT: torch.Tensor,
    loss: PolicyLoss,
    *,
    old_logprobs_BT: torch.Tensor | None = None,
    sampler_logprobs_BT: torch.Tensor | None = None,
    ref_logprobs_BT: torch.Tensor | None = None,
    episode_tokens_B: torch.Tensor | None = None,
) -> LossTerms:
    """The un-normalised loss terms of some rows (see the module docstring for the formulas).

    ``logprobs_BT`` carries the gradient; ``old_logprobs_BT`` defaults to ``logprobs_BT``
    detached (on-policy); without ``sampler_logprobs_BT`` there is no IS correction and no
    mismatch; ``ref_logprobs_BT`` is needed when ``loss.beta > 0``. ``episode_tokens_B`` is
    each row's episode's policy tokens over all its rows (`episode_tokens`; default: the
    row's own, as when no episode forked). Inputs in a type below float32 (bf16, fp16) are
    cast to float32 first; float64 stays float64.
    """
    if ref_logprobs_BT is None and loss.beta > 0:
        raise ConfigError("beta > 0 needs reference logprobs (a reference model)")
    dtype = torch.promote_types(logprobs_BT.dtype, torch.float32)
    logprobs_BT = logprobs_BT.to(dtype)
    mask_BT = loss_mask_BT.bool()
    zeros_BT = torch.zeros_like(logprobs_BT)
    current_BT = logprobs_BT.detach()
    old_BT = current_BT if old_logprobs_BT is None else old_logprobs_BT.detach().to(dtype)
    mismatch_BT = log_weights_BT = zeros_BT
    if sampler_logprobs_BT is not None:
        sampler_BT = sampler_logprobs_BT.detach().to(dtype)
        mismatch_BT = torch.where(mask_BT, current_BT - sampler_BT, zeros_BT)
        log_weights_BT = torch.where(mask_BT, old_BT - sampler_BT, zeros_BT)
    kl_BT = zeros_BT
    if ref_logprobs_BT is not None:
        ref_delta_BT = torch.where(
            mask_BT, ref_logprobs_BT.detach().to(dtype) - logprobs_BT, zeros_BT
        )
        kl_BT = torch.exp(ref_delta_BT) - ref_delta_BT - 1.0
    tokens_B = mask_BT.sum(dim=1)
    episode_B = tokens_B if episode_tokens_B is None else episode_tokens_B.to(tokens_B.device)
    if bool((episode_B < tokens_B).any()):
        raise ConfigError("episode_tokens_B must count at least each row's own policy tokens")
    share_B = torch.where(
        tokens_B > 0, tokens_B.to(dtype) / episode_B.clamp(min=1).to(dtype), zeros_BT[:, 0]
    )
    t = _Tokens(
        mask=mask_BT,
        zeros=zeros_BT,
        tokens=tokens_B,
        episode_tokens=episode_B,
        share=share_B,
        live=tokens_B > 0,
        advantages=advantages_B.detach().to(dtype),
        log_ratio=torch.where(mask_BT, logprobs_BT - old_BT, zeros_BT),
        log_weights=log_weights_BT,
        kl=kl_BT,
        corrected=sampler_logprobs_BT is not None,
    )
    part = _gspo(t, loss) if loss.loss_type is LossType.GSPO else _per_token(t, loss)
    abs_mismatch_BT = mismatch_BT.abs()
    return LossTerms(
        objective=part.objective,
        policy=part.policy.detach(),
        kl_sum=torch.where(mask_BT, kl_BT, zeros_BT).sum().detach(),
        tokens=tokens_B.sum(),
        rows=t.live.sum(),
        episodes=share_B.sum().detach(),
        clipped=part.clipped,
        is_weight_sum=part.is_weight_sum.detach(),
        is_limited=part.is_limited,
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
    episode_tokens_B: torch.Tensor | None = None,
) -> torch.Tensor:
    """The loss of one whole batch (normalised over these rows): a scalar with gradient.

    For micro-batches, use `policy_loss_terms` and divide by the whole batch's
    `loss_normalizer` (what `train_step` does). A batch without policy tokens gives 0.
    ``dr_grpo`` without ``max_completion_length`` divides by the `policy_span` of
    ``loss_mask_BT``, as `train_step` does for the same batch. ``episode_tokens_B``: see
    `policy_loss_terms` (a batch with forked episodes: `episode_tokens`).
    """
    terms = policy_loss_terms(
        logprobs_BT,
        advantages_B,
        loss_mask_BT,
        loss,
        old_logprobs_BT=old_logprobs_BT,
        sampler_logprobs_BT=sampler_logprobs_BT,
        ref_logprobs_BT=ref_logprobs_BT,
        episode_tokens_B=episode_tokens_B,
    )
    span = policy_span(loss_mask_BT)
    normalizer = loss_normalizer(loss, float(terms.tokens), float(terms.episodes), span)
    return terms.objective / normalizer if normalizer else terms.objective * 0.0
