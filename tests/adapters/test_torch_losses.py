"""Policy losses with hand-computed values, gradients, clipping, IS correction and KL.

The tensors are tiny: two rows of at most four completion tokens. ``m`` is the loss mask
(policy tokens), ``A`` the row advantages. On-policy (no ``old_logprobs``) every ratio is 1,
so a token's term is ``-A`` and its gradient with respect to its logprob is ``-A / N``.
"""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from nemogym_sdk.adapters.torch import PolicyLoss, policy_loss, policy_loss_terms  # noqa: E402
from nemogym_sdk.errors import ConfigError  # noqa: E402

MASK = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 0]])
"""Row 0 has two policy tokens, row 1 three; the rest is padding or environment tokens."""
ADV = torch.tensor([1.0, -0.5])


def val(tensor: torch.Tensor) -> float:
    """A scalar tensor's value (detached first, as torch asks)."""
    return float(tensor.detach())


def leaf(values: list[list[float]] | None = None) -> torch.Tensor:
    """Learner logprobs as a leaf tensor that records gradients (float64 for exact checks)."""
    data = values if values is not None else [[-1.0, -2.0, -3.0, -4.0], [-0.5, -1.5, -2.5, -3.5]]
    return torch.tensor(data, dtype=torch.float64, requires_grad=True)


@pytest.mark.parametrize(
    ("loss_type", "expected"),
    [
        # grpo: row means (-1) and (+0.5), mean over rows -> -0.25
        ("grpo", -0.25),
        # dapo: token sum -2 + 1.5 = -0.5 over 5 tokens -> -0.1
        ("dapo", -0.1),
        # dr_grpo: token sum -0.5 over rows * policy span = 2 * 3 (the last policy token is
        # row 1's third; the padded width 4 does not count) -> -1/12
        ("dr_grpo", -1 / 12),
        # gspo: sequence ratio 1, terms -1 and +0.5, mean over rows -> -0.25
        ("gspo", -0.25),
    ],
)
def test_on_policy_loss_values(loss_type: str, expected: float) -> None:
    """On-policy, each loss is -A averaged the way its normaliser says."""
    value = policy_loss(leaf(), ADV, MASK, PolicyLoss(loss_type=loss_type))  # type: ignore[arg-type]
    assert val(value) == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize(
    ("loss_type", "row0", "row1"),
    [
        # dapo: -A / 5 tokens on every policy token
        ("dapo", -1 / 5, 0.5 / 5),
        # grpo: -A / |o_i| / 2 rows
        ("grpo", -1 / 2 / 2, 0.5 / 3 / 2),
        # dr_grpo: -A / (2 rows * policy span 3)
        ("dr_grpo", -1 / 6, 0.5 / 6),
        # gspo: d s_i / d logp_it = s_i / |o_i|, -A_i * that / 2 rows
        ("gspo", -1 / 2 / 2, 0.5 / 3 / 2),
    ],
)
def test_gradients_and_masked_tokens(loss_type: str, row0: float, row1: float) -> None:
    """The gradient on each policy token is exact; masked tokens get exactly zero."""
    logprobs = leaf()
    value = policy_loss(logprobs, ADV, MASK, PolicyLoss(loss_type=loss_type))  # type: ignore[arg-type]
    (grad,) = torch.autograd.grad(value, logprobs)
    expected = torch.tensor([[row0, row0, 0, 0], [row1, row1, row1, 0]], dtype=torch.float64)
    torch.testing.assert_close(grad, expected, rtol=0, atol=1e-12)


@pytest.mark.parametrize(
    ("ratio", "advantage", "loss_value", "has_grad"),
    [
        (1.5, 1.0, -1.2, False),  # above 1 + eps with A > 0: clipped at 1.2, no gradient
        (1.5, -1.0, 1.5, True),  # above with A < 0: the unclipped (worse) term is kept
        (0.5, 1.0, -0.5, True),  # below 1 - eps with A > 0: unclipped is smaller, kept
        (0.5, -1.0, 0.8, False),  # below with A < 0: clipped at 0.8, no gradient
    ],
)
def test_clipping(ratio: float, advantage: float, loss_value: float, has_grad: bool) -> None:
    """PPO's pessimistic clip: min(r A, clip(r, 0.8, 1.2) A) on one token (dapo)."""
    logprobs = torch.tensor([[math.log(ratio)]], dtype=torch.float64, requires_grad=True)
    old = torch.zeros((1, 1), dtype=torch.float64)
    terms = policy_loss_terms(
        logprobs, torch.tensor([advantage]), torch.ones((1, 1)), PolicyLoss(), old_logprobs_BT=old
    )
    assert val(terms.objective) == pytest.approx(loss_value)
    assert int(terms.clipped) == (0 if has_grad else 1)
    (grad,) = torch.autograd.grad(terms.objective, logprobs)
    assert (float(grad) != 0.0) is has_grad
    if has_grad:  # d(-r A)/d logp = -r A
        assert float(grad) == pytest.approx(-ratio * advantage)


def test_clip_higher() -> None:
    """epsilon_high widens only the upper bound: a ratio of 1.25 stays unclipped at 0.28."""
    logprobs = torch.tensor([[math.log(1.25)]], dtype=torch.float64)
    old = torch.zeros((1, 1), dtype=torch.float64)
    for eps_high, expected in ((None, -1.2), (0.28, -1.25)):
        value = policy_loss(
            logprobs,
            torch.tensor([1.0]),
            torch.ones((1, 1)),
            PolicyLoss(epsilon_high=eps_high),
            old_logprobs_BT=old,
        )
        assert val(value) == pytest.approx(expected)


def test_importance_weights_truncate_and_mask() -> None:
    """Weights exp(old - sampler) = [0.5, 2, 5] with cap 3: truncate -> [0.5, 2, 3]; mask ->
    [0.5, 2, 0]; mask with floor 1 -> [0, 2, 0]. On-policy with A = 1 each token's term is -w,
    and the dapo loss is their mean over 3 tokens."""
    logprobs = torch.zeros((1, 3), dtype=torch.float64)
    sampler = -torch.log(torch.tensor([[0.5, 2.0, 5.0]], dtype=torch.float64))
    cases = {
        PolicyLoss(importance_sampling="truncate"): (-(0.5 + 2 + 3) / 3, 1),
        PolicyLoss(importance_sampling="mask"): (-(0.5 + 2) / 3, 1),
        PolicyLoss(importance_sampling="mask", is_floor=1.0): (-2 / 3, 2),
        PolicyLoss(importance_sampling="none"): (-1.0, 0),
    }
    for config, (expected, limited) in cases.items():
        terms = policy_loss_terms(
            logprobs, torch.tensor([1.0]), torch.ones((1, 3)), config, sampler_logprobs_BT=sampler
        )
        assert val(terms.objective) / 3 == pytest.approx(expected)
        assert int(terms.is_limited) == limited


def test_gspo_uses_the_geometric_mean_weight_per_row() -> None:
    """gspo: one row, weights [2, 8] -> sequence weight sqrt(16) = 4, truncated at 3."""
    logprobs = torch.zeros((1, 2), dtype=torch.float64)
    sampler = -torch.log(torch.tensor([[2.0, 8.0]], dtype=torch.float64))
    terms = policy_loss_terms(
        logprobs,
        torch.tensor([1.0]),
        torch.ones((1, 2)),
        PolicyLoss(loss_type="gspo"),
        sampler_logprobs_BT=sampler,
    )
    assert val(terms.objective) == pytest.approx(-3.0)
    assert int(terms.is_limited) == 1


def test_gspo_sequence_ratio_clips_per_row() -> None:
    """gspo with epsilon 0.2: token log-ratios [0, ln 2] -> s = exp(ln 2 / 2) = 1.414 > 1.2,
    so with A = 1 the row term is -1.2 and the row counts as clipped."""
    logprobs = torch.tensor([[0.0, math.log(2.0)]], dtype=torch.float64, requires_grad=True)
    terms = policy_loss_terms(
        logprobs,
        torch.tensor([1.0]),
        torch.ones((1, 2)),
        PolicyLoss(loss_type="gspo"),
        old_logprobs_BT=torch.zeros((1, 2), dtype=torch.float64),
    )
    assert val(terms.objective) == pytest.approx(-1.2)
    assert int(terms.clipped) == 1


def test_kl_penalty_k3() -> None:
    """KL term per token: exp(ref - logp) - (ref - logp) - 1; with ref - logp = ln 2 that is
    2 - ln 2 - 1 = 0.3069; beta 0.5 adds 0.5 * 0.3069 to the dapo loss (A = 0 here)."""
    logprobs = torch.zeros((1, 2), dtype=torch.float64)
    ref = torch.full((1, 2), math.log(2.0), dtype=torch.float64)
    config = PolicyLoss(beta=0.5)
    terms = policy_loss_terms(
        logprobs, torch.tensor([0.0]), torch.ones((1, 2)), config, ref_logprobs_BT=ref
    )
    k3 = 2 - math.log(2) - 1
    assert val(terms.kl_sum) == pytest.approx(2 * k3)
    assert val(terms.objective) == pytest.approx(0.5 * 2 * k3)
    with pytest.raises(ConfigError, match="reference"):
        policy_loss_terms(logprobs, torch.tensor([0.0]), torch.ones((1, 2)), config)


def test_mismatch_metrics_cover_policy_tokens_only() -> None:
    """|learner - sampler| = [0.1, 0.3] on policy tokens; the masked token's 5.0 is ignored."""
    logprobs = torch.tensor([[-1.0, -1.0, -1.0]], dtype=torch.float64)
    sampler = torch.tensor([[-1.1, -0.7, -6.0]], dtype=torch.float64)
    terms = policy_loss_terms(
        logprobs,
        torch.tensor([1.0]),
        torch.tensor([[1, 1, 0]]),
        PolicyLoss(),
        sampler_logprobs_BT=sampler,
    )
    assert val(terms.mismatch_abs_sum) == pytest.approx(0.4)
    assert val(terms.mismatch_abs_max) == pytest.approx(0.3)
    expected_k3 = sum(math.exp(-d) + d - 1 for d in (0.1, -0.3))
    assert val(terms.mismatch_kl_sum) == pytest.approx(expected_k3)


def test_nan_at_padding_does_not_leak() -> None:
    """A NaN logprob on a masked position changes neither the loss nor the other gradients."""
    logprobs = leaf([[-1.0, float("nan"), -3.0, -4.0], [-0.5, -1.5, -2.5, float("nan")]])
    mask = torch.tensor([[1, 0, 1, 1], [1, 1, 1, 0]])
    value = policy_loss(logprobs, ADV, mask, PolicyLoss())
    (grad,) = torch.autograd.grad(value, logprobs)
    assert math.isfinite(val(value))
    assert torch.isfinite(grad).all()
    assert float(grad[0, 1]) == 0.0 and float(grad[1, 3]) == 0.0


def test_bad_configurations_are_config_errors() -> None:
    """Unknown loss types and out-of-range knobs fail at construction."""
    for kwargs in (
        {"loss_type": "ppo"},
        {"importance_sampling": "clip"},
        {"epsilon": 1.5},
        {"is_cap": 0.0},
        {"beta": -1.0},
        {"max_completion_length": 0},
        {"is_floor": 3.0},
    ):
        with pytest.raises(ConfigError):
            PolicyLoss(**kwargs)  # type: ignore[arg-type]


def test_the_loss_vocabulary_is_the_core_one() -> None:
    """The adapter re-exports the torch-free records of ``nemogym_sdk.grpo``: one copy."""
    from nemogym_sdk import adapters, grpo

    for name in ("ImportanceSampling", "LossType", "PolicyLoss"):
        assert getattr(adapters.torch, name) is getattr(grpo, name)
