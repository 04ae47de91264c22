"""train_step: gradient accumulation is exact, failures and padding change nothing, metrics."""

from __future__ import annotations

import attrs
import numpy as np
import pytest

from nemogym_sdk import Rollout, RolloutStatus, SamplingParams, collate
from nemogym_sdk.adapters.torch import PolicyLoss, StepMetrics, train_step
from nemogym_sdk.errors import ConfigError
from nemogym_sdk.grpo import compute_advantages

from .conftest import PAD, lora_policy, rollout, torch

ADVANTAGES = np.array([1.0, -0.5, 0.25], dtype=np.float32)
PLAIN = SamplingParams()
"""Rollouts played with the API defaults (temperature 1, no top-p): the raw log-softmax."""


def gradients(
    rollouts: list[Rollout], advantages: np.ndarray, **kwargs: object
) -> dict[str, torch.Tensor]:
    """The LoRA gradients of one train_step (SGD with lr 0, so the weights stay put)."""
    model = lora_policy(perturb=0.2)
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.SGD(trainable, lr=0.0)
    pad_to = kwargs.pop("pad_to_multiple_of", None)
    batch = collate(rollouts, pad_token_id=PAD, pad_to_multiple_of=pad_to)  # type: ignore[arg-type]
    kwargs.setdefault("sampling", PLAIN)
    train_step(model, optimizer, batch, advantages, max_grad_norm=None, **kwargs)  # type: ignore[arg-type]
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys() and a
    for name in a:
        torch.testing.assert_close(a[name], b[name], atol=1e-6, rtol=1e-4, msg=name)


@pytest.mark.parametrize("loss_type", ["grpo", "dapo", "dr_grpo", "gspo"])
def test_micro_batches_and_padding_give_the_full_batch_gradient(
    rollouts: list[Rollout], loss_type: str
) -> None:
    """One row per micro-batch, all rows at once, and extra padding: the same gradient."""
    loss = PolicyLoss(loss_type=loss_type)  # type: ignore[arg-type]
    whole = gradients(rollouts, ADVANTAGES, loss=loss, micro_batch_size=8)
    assert any(float(g.abs().sum()) > 0 for g in whole.values())
    assert_same(whole, gradients(rollouts, ADVANTAGES, loss=loss, micro_batch_size=1))
    assert_same(whole, gradients(rollouts, ADVANTAGES, loss=loss, pad_to_multiple_of=16))


def test_failed_rollouts_never_reach_the_loss(rollouts: list[Rollout]) -> None:
    """Adding failed rollouts (whatever their advantage) changes neither gradient nor counts."""
    failed = Rollout.failed(RolloutStatus.TIMEOUT, 258, error="deadline")
    failed = attrs.evolve(failed, row_id="r0", repeat_index=3)
    garbage = rollout([257, 1, 2], [3, 4, 5], [1, 1, 1], status=RolloutStatus.DRIFT)
    with_failures = [*rollouts, failed, garbage]
    advantages = np.array([*ADVANTAGES, 5.0, -7.0], dtype=np.float32)
    assert_same(
        gradients(rollouts, ADVANTAGES), gradients(with_failures, advantages, micro_batch_size=2)
    )


def test_metrics_count_policy_tokens_and_report_mismatch(rollouts: list[Rollout]) -> None:
    """tokens counts mask-1 tokens of OK rows (4 + 4 + 2); with the sampler's logprobs set to
    the learner's own, the mismatch is ~0, and after shifting one token by 0.5 it is 0.5."""
    model = lora_policy(perturb=0.2)
    from nemogym_sdk.adapters.torch import token_logprobs

    batch = collate(rollouts, pad_token_id=PAD)
    with torch.no_grad():
        own = token_logprobs(model, batch).numpy()
    shifted = own.copy()
    shifted[0, 1] += 0.5
    sampled = [
        attrs.evolve(r, logprobs=shifted[b, : len(r.completion_ids)])
        for b, r in enumerate(rollouts)
    ]
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.0)
    metrics = train_step(
        model, optimizer, collate(sampled, pad_token_id=PAD), ADVANTAGES, sampling=PLAIN
    )
    assert isinstance(metrics, StepMetrics)
    assert (metrics.tokens, metrics.rows, metrics.micro_batches) == (10, 3, 1)
    assert metrics.mismatch_max == pytest.approx(0.5, abs=1e-4)
    assert metrics.mismatch_mean == pytest.approx(0.05, abs=1e-4)
    assert metrics.stepped and metrics.clip_fraction == 0.0
    assert metrics.is_weight_mean == pytest.approx(
        np.mean([1] + [np.exp(-0.5)] + [1] * 8), abs=1e-3
    )
    assert set(metrics.as_dict("train/")) >= {"train/loss", "train/mismatch_max", "train/grad_norm"}


def test_reference_kl_is_zero_for_the_zero_adapter_then_grows(rollouts: list[Rollout]) -> None:
    """ref_model='disable_adapter': a fresh LoRA (B = 0) equals its base, so KL is 0; after
    a few Adam steps the adapter moved and KL to the base is positive."""
    model = lora_policy()
    optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=0.05)
    batch = collate(rollouts, pad_token_id=PAD)
    loss = PolicyLoss(beta=0.1)
    first = train_step(
        model, optimizer, batch, ADVANTAGES, sampling=PLAIN, loss=loss, ref_model="disable_adapter"
    )
    assert first.kl == pytest.approx(0.0, abs=1e-9)
    for _ in range(3):
        last = train_step(
            model,
            optimizer,
            batch,
            ADVANTAGES,
            sampling=PLAIN,
            loss=loss,
            ref_model="disable_adapter",
        )
    assert last.kl > 1e-6


def test_all_rows_failed_or_zero_tokens_skips_the_optimizer(rollouts: list[Rollout]) -> None:
    """No policy token anywhere: no step, zero loss, and the weights stay put."""
    model = lora_policy(perturb=0.2)
    before = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=1.0)
    failed = [attrs.evolve(r, status=RolloutStatus.AGENT_ERROR) for r in rollouts]
    metrics = train_step(
        model, optimizer, collate(failed, pad_token_id=PAD), ADVANTAGES, sampling=PLAIN
    )
    assert not metrics.stepped and metrics.tokens == 0 and metrics.loss == 0.0
    for name, param in model.named_parameters():
        if param.requires_grad:
            assert torch.equal(param, before[name])


def test_takes_compute_advantages_and_checks_its_inputs(rollouts: list[Rollout]) -> None:
    """An Advantages record is accepted; wrong shapes and bad settings are ConfigErrors."""
    model = lora_policy()
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
    batch = collate(rollouts, pad_token_id=PAD)
    metrics = train_step(
        model, optimizer, batch, compute_advantages(batch, scale="none"), sampling=PLAIN
    )
    assert metrics.tokens == 10
    with pytest.raises(ConfigError, match="one advantage per batch row"):
        train_step(model, optimizer, batch, [1.0, 2.0], sampling=PLAIN)
    with pytest.raises(ConfigError, match="micro_batch_size"):
        train_step(model, optimizer, batch, ADVANTAGES, sampling=PLAIN, micro_batch_size=0)
    with pytest.raises(ConfigError, match="ref_model"):
        train_step(model, optimizer, batch, ADVANTAGES, sampling=PLAIN, loss=PolicyLoss(beta=0.1))
    with pytest.raises(ConfigError, match="finite"):
        train_step(model, optimizer, batch, [1.0, float("nan"), 0.0], sampling=PLAIN)


def test_mask_truncated_leaves_cut_completions_out(rollouts: list[Rollout]) -> None:
    """With mask_truncated, a truncated row is not in the loss (DAPO's overlong filtering)."""
    cut = [attrs.evolve(rollouts[0], truncated=True), *rollouts[1:]]
    model = lora_policy()
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.0)
    batch = collate(cut, pad_token_id=PAD)
    kept = train_step(
        model, optimizer, batch, ADVANTAGES, sampling=PLAIN, loss=PolicyLoss(mask_truncated=True)
    )
    assert (kept.rows, kept.tokens) == (2, 6)


def test_old_logprobs_drive_the_ratio(rollouts: list[Rollout]) -> None:
    """old_logprobs equal to the current policy's reproduce the on-policy gradient; after an
    update, the same old_logprobs make ratios != 1 (a second PPO epoch), so some get clipped
    with a small epsilon. A wrong shape is a ConfigError."""
    from nemogym_sdk.adapters.torch import token_logprobs

    batch = collate(rollouts, pad_token_id=PAD)
    model = lora_policy(perturb=0.2)
    with torch.no_grad():
        old = token_logprobs(model, batch)
    assert_same(
        gradients(rollouts, ADVANTAGES),
        gradients(rollouts, ADVANTAGES, old_logprobs=old),
    )
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=1.0)
    train_step(model, optimizer, batch, ADVANTAGES, sampling=PLAIN)
    second = train_step(
        model,
        optimizer,
        batch,
        ADVANTAGES,
        sampling=PLAIN,
        old_logprobs=old,
        loss=PolicyLoss(epsilon=1e-4),
    )
    assert second.clip_fraction > 0
    with pytest.raises(ConfigError, match="old_logprobs"):
        train_step(model, optimizer, batch, ADVANTAGES, sampling=PLAIN, old_logprobs=old[:, :2])
