"""One GRPO optimizer step over a ``Batch``: micro-batches, gradient accumulation, metrics.

`train_step` is what a hand-written loop calls once per batch of rollouts::

    advantages = compute_advantages(batch)
    metrics = train_step(model, optimizer, batch, advantages, sampling=client.sampling)

``sampling`` is the ``SamplingParams`` the rollouts were played with: the learner's logprobs
then describe the distribution the sampler drew from (same temperature and top-p).

Rows that are not ``OK`` (``Batch.ok``) never reach the model: their tokens are not in the loss
and not in its normaliser. Every ``OK`` row with a policy token is forwarded, ``micro_batch_size``
rows at a time; each micro-batch's loss is divided by the *whole batch's* normaliser, so the
accumulated gradient equals the full-batch gradient whatever the micro-batch size.

Several processes (``torchrun``): each rank passes its own shard of the batch (shard by whole
groups, so ``compute_advantages`` sees complete groups; pass it ``gather=all_gather_array``
for batch statistics); normalisers and metrics are reduced over ranks and gradients summed, so
every rank applies the same update. Pass the plain model, not a ``DistributedDataParallel``
wrapper: the step all-reduces gradients itself.
"""

from __future__ import annotations

import math
import time
from typing import Any, Literal

import attrs
import numpy as np
import numpy.typing as npt
import torch
import torch.distributed as dist

from nemogym_sdk.adapters.torch._dist import all_reduce_grads, all_reduce_values
from nemogym_sdk.adapters.torch.logprobs import (
    completion_logprobs,
    learner_processing,
    model_device,
)
from nemogym_sdk.adapters.torch.losses import (
    LossTerms,
    PolicyLoss,
    episode_tokens,
    loss_normalizer,
    policy_loss_terms,
    policy_span,
)
from nemogym_sdk.adapters.torch.sharding import is_sharded, pad_micro_batches
from nemogym_sdk.errors import ConfigError
from nemogym_sdk.grpo import Advantages
from nemogym_sdk.policy import SamplingParams
from nemogym_sdk.records import Batch

__all__ = ["DEFAULT_LOSS", "Reference", "StepMetrics", "train_step"]

DEFAULT_LOSS = PolicyLoss()
"""``train_step``'s default loss: ``dapo`` with epsilon 0.2 and truncated IS correction."""

Reference = torch.nn.Module | Literal["disable_adapter"] | None
"""A frozen reference model for the KL term, ``"disable_adapter"`` (a peft model's base weights,
the usual reference when training a LoRA adapter), or None."""


@attrs.frozen(kw_only=True)
class StepMetrics:
    """What one `train_step` did, reduced over ranks (means are over policy tokens)."""

    loss: float
    """The objective whose gradient was applied: policy term plus ``beta`` times KL."""
    policy_loss: float
    """The policy term alone."""
    kl: float
    """Mean k3 KL to the reference per policy token (0 without a reference)."""
    clip_fraction: float
    """Share of policy tokens (rows for gspo) where the clipped term was taken."""
    mismatch_mean: float
    """Mean ``|learner logprob - sampler logprob|`` over policy tokens, before the update."""
    mismatch_max: float
    """Largest ``|learner logprob - sampler logprob|`` over policy tokens."""
    mismatch_kl: float
    """Mean k3 estimate of the sampler-learner KL per policy token."""
    is_weight_mean: float
    """Mean importance weight applied (1.0 without correction)."""
    is_limited_fraction: float
    """Share of policy tokens (rows for gspo) whose weight left ``[is_floor, is_cap]``
    (truncated or masked)."""
    grad_norm: float
    """Gradient norm before clipping (all ranks' gradients summed)."""
    tokens: int
    """Policy tokens in the loss."""
    rows: int
    """Rows in the loss (OK, with at least one policy token)."""
    micro_batches: int
    """Forward/backward passes run on this rank."""
    stepped: bool
    """Whether the optimizer stepped (False when the batch had no policy token)."""
    forward_backward_s: float
    """Seconds in forward and backward passes on this rank."""
    optimizer_s: float
    """Seconds reducing gradients, clipping and stepping on this rank."""

    def as_dict(self, prefix: str = "") -> dict[str, float]:
        """The metrics as a flat ``{prefix + name: float}`` dict for a logger."""
        return {f"{prefix}{f.name}": float(getattr(self, f.name)) for f in attrs.fields(type(self))}


def train_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    batch: Batch,
    advantages: Advantages | npt.ArrayLike | torch.Tensor,
    *,
    sampling: SamplingParams,
    loss: PolicyLoss = DEFAULT_LOSS,
    micro_batch_size: int = 8,
    ref_model: Reference = None,
    old_logprobs: npt.ArrayLike | torch.Tensor | None = None,
    max_grad_norm: float | None = 1.0,
    distributed: bool | None = None,
) -> StepMetrics:
    """Run forward/backward over ``batch`` in micro-batches, then one optimizer step.

    Args:
        model: the policy (e.g. a peft model); its trainable parameters get the update.
        optimizer: the optimizer over those parameters.
        batch: this rank's rows (``collate``); rows that are not OK are skipped.
        advantages: one per row: ``compute_advantages(batch)`` or a ``[B]`` array.
        sampling: the ``SamplingParams`` the rollouts were played with (``AgentClient``'s
            ``sampling``). The learner applies the same temperature and top-p, so its
            logprobs describe the distribution the tokens were drawn from (the sampler must
            report ``processed_logprobs``, or sample with temperature 1 and no top-p). A
            field left None means the API default 1.0, as on the sampler when the row sets
            no value either (see `learner_processing`); greedy sampling is a ConfigError.
        loss: which policy loss and its knobs.
        micro_batch_size: rows per forward/backward pass (gradient accumulation).
        ref_model: reference for the KL term; needed when ``loss.beta > 0``.
        old_logprobs: ``[B, T]`` logprobs of the policy that produced the batch, for a second
            optimizer step on the same batch; None = on-policy (the current model's).
        max_grad_norm: clip the gradient norm to this; None = no clipping.
        distributed: reduce normalisers, metrics and gradients over the default process
            group; None = when ``torch.distributed`` is initialised. False computes this
            rank's batch alone (e.g. a single-process reference inside a distributed job).
            A model sharded with FSDP2 (``sharding.shard``) has its gradients reduced by
            FSDP, and every rank runs as many micro-batches (empty ones where it has fewer).
    """
    temperature, top_p = learner_processing(sampling)
    _check_arguments(model, loss, ref_model, micro_batch_size)
    device = model_device(model)
    collective = (
        dist.is_available() and dist.is_initialized() if distributed is None else distributed
    )
    advantages_B = _advantages(advantages, len(batch))
    old_BT = _old_logprobs(old_logprobs, batch)
    loss_mask_BT = batch.loss_mask  # completion_mask * env_mask * ok, computed once per step
    rows, episode_tokens_B, normalizer = _rows_in_the_loss(
        batch, loss_mask_BT, loss, device, collective
    )

    optimizer.zero_grad(set_to_none=True)
    began = time.perf_counter()
    totals = _Totals()
    sharded = collective and is_sharded(model)
    starts = list(range(0, len(rows), micro_batch_size))
    if sharded:  # FSDP gathers are collectives: every rank runs as many passes
        starts += [-1] * (pad_micro_batches(len(starts), device) - len(starts))
    for start in starts:
        picked = rows[start : start + micro_batch_size] if start >= 0 else _any_row(batch)
        terms = _micro_batch(
            model,
            batch,
            loss_mask_BT,
            picked,
            advantages_B,
            loss,
            device,
            processing={"temperature": temperature, "top_p": top_p},
            ref_model=ref_model,
            old_BT=old_BT,
            episode_tokens_B=episode_tokens_B if start >= 0 else None,
        )
        if start < 0:  # an empty pass of a sharded model: its collectives, no gradient
            if normalizer > 0:
                (terms.objective * 0.0).backward()  # type: ignore[no-untyped-call]
            continue
        if normalizer > 0:
            (terms.objective / normalizer).backward()  # type: ignore[no-untyped-call]
        totals.add(terms)
    forward_backward_s = time.perf_counter() - began

    began = time.perf_counter()
    stepped = normalizer > 0
    grad_norm = _update(
        model,
        optimizer,
        max_grad_norm,
        collective=collective and not sharded,  # FSDP reduce-scatters the gradients itself
        stepped=stepped,
    )
    return totals.metrics(
        collective=collective,
        normalizer=normalizer,
        per_row=loss.loss_type == "gspo",
        device=device,
        grad_norm=grad_norm,
        stepped=stepped,
        forward_backward_s=forward_backward_s,
        optimizer_s=time.perf_counter() - began,
    )


def _rows_in_the_loss(
    batch: Batch,
    loss_mask_BT: npt.NDArray[np.int8],
    loss: PolicyLoss,
    device: torch.device,
    collective: bool,
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], float]:
    """The rows the loss trains on, each row's episode's token count among them, and the
    step's normaliser (over every rank when ``collective``)."""
    rows = _trainable_rows(batch, loss_mask_BT, loss)
    kept_BT = np.zeros_like(loss_mask_BT)
    kept_BT[rows] = loss_mask_BT[rows]  # the rows in the loss; a whole group is on a rank
    episode_tokens_B = episode_tokens(
        torch.from_numpy(np.array(batch.episode_index, dtype=np.int64)), torch.from_numpy(kept_BT)
    ).numpy()
    episodes = float(len(np.unique(batch.episode_index[rows])))  # a forked one counts once
    return (
        rows,
        episode_tokens_B,
        _normalizer(loss_mask_BT[rows], episodes, loss, device, collective),
    )


def _any_row(batch: Batch) -> npt.NDArray[np.int64]:
    """One row to run an empty pass on (its loss is multiplied by 0)."""
    if len(batch) == 0:
        raise ConfigError("a sharded model needs at least one row on every rank")
    return np.zeros(1, dtype=np.int64)


def _check_arguments(
    model: torch.nn.Module, loss: PolicyLoss, ref_model: Reference, micro_batch_size: int
) -> None:
    if micro_batch_size < 1:
        raise ConfigError(f"micro_batch_size must be >= 1, got {micro_batch_size}")
    if isinstance(model, torch.nn.parallel.DistributedDataParallel):
        raise ConfigError(
            "pass the unwrapped module (model.module): train_step all-reduces gradients itself"
        )
    if loss.beta > 0 and ref_model is None:
        raise ConfigError("loss.beta > 0 needs ref_model (a module, or 'disable_adapter')")


def _old_logprobs(
    old_logprobs: npt.ArrayLike | torch.Tensor | None, batch: Batch
) -> torch.Tensor | None:
    if old_logprobs is None:
        return None
    old_BT = torch.as_tensor(old_logprobs, dtype=torch.float32)
    if tuple(old_BT.shape) != batch.completion_ids.shape:
        raise ConfigError(
            f"old_logprobs must have the batch's completion shape "
            f"{batch.completion_ids.shape}, got {tuple(old_BT.shape)}"
        )
    return old_BT


def _normalizer(
    kept_BT: npt.NDArray[np.int8],
    episodes: float,
    loss: PolicyLoss,
    device: torch.device,
    collective: bool,
) -> float:
    """The whole batch's normaliser over the rows in the loss of every rank (``episodes``:
    those rows as episodes, a forked episode's rows counting once)."""
    tokens, row_count = all_reduce_values(
        [float(kept_BT.sum()), episodes],
        dist.ReduceOp.SUM,
        device,
        enabled=collective,
    )
    # dr_grpo without a configured length: the policy span over every rank's rows in the loss
    # (the same number policy_loss takes from the loss mask; padding cannot change it)
    (span,) = all_reduce_values(
        [float(policy_span(torch.from_numpy(np.ascontiguousarray(kept_BT))))],
        dist.ReduceOp.MAX,
        device,
        enabled=collective,
    )
    return loss_normalizer(loss, tokens, row_count, int(span))


def _update(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    max_grad_norm: float | None,
    *,
    collective: bool,
    stepped: bool,
) -> float:
    """Sum gradients over ranks, clip, step; returns the gradient norm before clipping."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    all_reduce_grads(trainable, enabled=collective)
    grad_norm = 0.0
    if any(p.grad is not None for p in trainable):
        limit = math.inf if max_grad_norm is None else max_grad_norm
        norm = torch.nn.utils.clip_grad_norm_(trainable, limit)
        full = getattr(norm, "full_tensor", None)  # a sharded model's norm is a DTensor
        grad_norm = float(full() if full is not None else norm)
    if stepped:
        optimizer.step()
    return grad_norm


def _micro_batch(
    model: torch.nn.Module,
    batch: Batch,
    loss_mask_BT: npt.NDArray[np.int8],
    picked: npt.NDArray[np.int64],
    advantages_B: npt.NDArray[np.float32],
    loss: PolicyLoss,
    device: torch.device,
    *,
    processing: dict[str, Any],
    ref_model: Reference,
    old_BT: torch.Tensor | None,
    episode_tokens_B: npt.NDArray[np.int64] | None,
) -> LossTerms:
    def rows_of(array: npt.NDArray[Any], dtype: torch.dtype) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(array[picked])).to(device=device, dtype=dtype)

    inputs = (
        rows_of(batch.prompt_ids, torch.long),
        rows_of(batch.prompt_mask, torch.long),
        rows_of(batch.completion_ids, torch.long),
        rows_of(batch.completion_mask, torch.long),
    )
    logprobs_bT = completion_logprobs(model, *inputs, **processing)
    ref_bT = None
    if ref_model is not None:
        with torch.no_grad():
            if ref_model == "disable_adapter":
                with model.disable_adapter():  # type: ignore[operator]
                    ref_bT = completion_logprobs(model, *inputs, **processing)
            else:
                assert isinstance(ref_model, torch.nn.Module)
                ref_bT = completion_logprobs(ref_model, *inputs, **processing)
    old_bT = None if old_BT is None else old_BT[torch.from_numpy(picked)].to(device)
    return policy_loss_terms(
        logprobs_bT,
        torch.from_numpy(advantages_B[picked]).to(device),
        rows_of(loss_mask_BT, torch.bool),
        loss,
        old_logprobs_BT=old_bT,
        sampler_logprobs_BT=rows_of(batch.logprobs, torch.float32),
        ref_logprobs_BT=ref_bT,
        episode_tokens_B=None
        if episode_tokens_B is None
        else rows_of(episode_tokens_B, torch.long),
    )


class _Totals:
    """Sums of `LossTerms` over micro-batches, reduced over ranks at the end."""

    _SUMS: tuple[str, ...] = (
        *("objective", "policy", "kl_sum", "clipped", "is_weight_sum", "is_limited"),
        *("mismatch_abs_sum", "mismatch_kl_sum", "tokens", "rows"),
    )

    def __init__(self) -> None:
        self.sums = dict.fromkeys(self._SUMS, 0.0)
        self.mismatch_max = 0.0
        self.micro_batches = 0

    def add(self, terms: LossTerms) -> None:
        for name in self._SUMS:
            self.sums[name] += float(getattr(terms, name).detach())
        self.mismatch_max = max(self.mismatch_max, float(terms.mismatch_abs_max))
        self.micro_batches += 1

    def metrics(
        self,
        *,
        collective: bool,
        normalizer: float,
        per_row: bool,
        device: torch.device,
        **extra: Any,
    ) -> StepMetrics:
        values = all_reduce_values(
            list(self.sums.values()), dist.ReduceOp.SUM, device, enabled=collective
        )
        sums = dict(zip(self._SUMS, values, strict=True))
        (mismatch_max,) = all_reduce_values(
            [self.mismatch_max], dist.ReduceOp.MAX, device, enabled=collective
        )
        tokens, rows = sums["tokens"], sums["rows"]
        units = rows if per_row else tokens  # what clip and IS fractions count

        def mean(name: str, over: float) -> float:
            return sums[name] / over if over else 0.0

        return StepMetrics(
            loss=mean("objective", normalizer),
            policy_loss=mean("policy", normalizer),
            kl=mean("kl_sum", tokens),
            clip_fraction=mean("clipped", units),
            mismatch_mean=mean("mismatch_abs_sum", tokens),
            mismatch_max=mismatch_max,
            mismatch_kl=mean("mismatch_kl_sum", tokens),
            is_weight_mean=mean("is_weight_sum", units) if units else 1.0,
            is_limited_fraction=mean("is_limited", units),
            tokens=int(tokens),
            rows=int(rows),
            micro_batches=self.micro_batches,
            **extra,
        )


def _trainable_rows(
    batch: Batch, loss_mask_BT: npt.NDArray[np.int8], loss: PolicyLoss
) -> npt.NDArray[np.int64]:
    """OK rows with at least one policy token (and not truncated, with ``mask_truncated``)."""
    keep_B = batch.ok & (loss_mask_BT.sum(axis=1) > 0)
    if loss.mask_truncated:
        keep_B &= ~batch.truncated
    return np.flatnonzero(keep_B).astype(np.int64)


def _advantages(
    advantages: Advantages | npt.ArrayLike | torch.Tensor, rows: int
) -> npt.NDArray[np.float32]:
    if isinstance(advantages, Advantages):
        values = np.asarray(advantages.values, dtype=np.float32)
    elif isinstance(advantages, torch.Tensor):
        values = advantages.detach().cpu().numpy().astype(np.float32)
    else:
        values = np.asarray(advantages, dtype=np.float32)
    if values.shape != (rows,):
        raise ConfigError(f"need one advantage per batch row ({rows}), got shape {values.shape}")
    if not np.all(np.isfinite(values)):
        bad = np.flatnonzero(~np.isfinite(values))
        raise ConfigError(
            f"advantages must be finite, got {values[bad[0]]} at row {int(bad[0])} "
            f"({len(bad)} row(s) in all)"
        )
    return values
