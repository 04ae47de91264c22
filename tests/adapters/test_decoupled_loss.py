"""The decoupled objective for stale tokens, with hand-computed values.

Three policies per token (AReaL's decoupled PPO, arXiv 2505.24298): the *behaviour* policy
that sampled it (the sampler's logprob, from an adapter version up to ``max_staleness``
old), the *proximal* policy (the learner's own logprob before the step: ``old``), and the
policy being trained (``logp``). The token term is

    -w * min(r * A, clip(r, 1 - eps, 1 + eps_high) * A),   r = exp(logp - old),
     w = exp(old - behaviour), truncated to [is_floor, is_cap] or masked outside it

so clipping is against the proximal policy and the staleness is corrected by ``w`` alone.
Row 0 below was sampled by the current adapter (behaviour = proximal), row 1 by a stale one.
"""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from nemogym_sdk.adapters.torch import PolicyLoss, policy_loss, policy_loss_terms  # noqa: E402

MASK = torch.tensor([[1, 1], [1, 1]])
ADV = torch.tensor([1.0, 1.0])
PROXIMAL = torch.tensor([[-1.0, -2.0], [-1.0, -2.0]], dtype=torch.float64)
# row 1's behaviour logprobs: w = exp(old - behaviour) = exp(0.5) = 1.6487 and exp(-2) = 0.1353
BEHAVIOUR = torch.tensor([[-1.0, -2.0], [-1.5, 0.0]], dtype=torch.float64)


def learner(values: torch.Tensor) -> torch.Tensor:
    return values.clone().requires_grad_(True)


def test_on_policy_step_weights_each_token_by_its_staleness_correction() -> None:
    """logp = old (one step per batch): r = 1, the term is -w * A; dapo over 4 tokens.

    loss = -(1 + 1 + e^0.5 + e^-2) / 4 and d loss / d logp = -w / 4 per token."""
    logp = learner(PROXIMAL)
    value = policy_loss(logp, ADV, MASK, PolicyLoss(), sampler_logprobs_BT=BEHAVIOUR)
    weights = [1.0, 1.0, math.exp(0.5), math.exp(-2.0)]
    assert float(value.detach()) == pytest.approx(-sum(weights) / 4, abs=1e-12)
    value.backward()
    assert logp.grad is not None
    assert logp.grad.flatten().tolist() == pytest.approx([-w / 4 for w in weights], abs=1e-12)


def test_clipping_is_against_the_proximal_policy_not_the_behaviour_one() -> None:
    """A second pass over the batch (``old`` given, logp moved by +0.3 on every token):
    r = e^0.3 = 1.35 > 1.2 is clipped for A > 0 whatever the behaviour policy was, so the
    terms are -w * 1.2 and carry no gradient."""
    logp = learner(PROXIMAL + 0.3)
    terms = policy_loss_terms(
        logp, ADV, MASK, PolicyLoss(), old_logprobs_BT=PROXIMAL, sampler_logprobs_BT=BEHAVIOUR
    )
    weights = [1.0, 1.0, math.exp(0.5), math.exp(-2.0)]
    assert float(terms.objective.detach()) == pytest.approx(-1.2 * sum(weights), abs=1e-12)
    assert int(terms.clipped) == 4
    terms.objective.backward()
    assert logp.grad is not None and not logp.grad.any()


def test_caps_truncate_or_mask_the_weights() -> None:
    """is_cap 1.5 and is_floor 0.5: e^0.5 = 1.65 is cut to 1.5 (truncate) or dropped
    (mask), e^-2 = 0.14 raised to 0.5 or dropped; both are counted as limited."""
    logp = learner(PROXIMAL)
    kwargs = {"is_cap": 1.5, "is_floor": 0.5}
    truncated = policy_loss_terms(
        logp,
        ADV,
        MASK,
        PolicyLoss(importance_sampling="truncate", **kwargs),
        sampler_logprobs_BT=BEHAVIOUR,
    )
    assert float(truncated.objective.detach()) == pytest.approx(-(1 + 1 + 1.5 + 0.5), abs=1e-12)
    assert int(truncated.is_limited) == 2
    masked = policy_loss_terms(
        logp,
        ADV,
        MASK,
        PolicyLoss(importance_sampling="mask", **kwargs),
        sampler_logprobs_BT=BEHAVIOUR,
    )
    assert float(masked.objective.detach()) == pytest.approx(-2.0, abs=1e-12)
    assert float(masked.is_weight_sum) == pytest.approx(2.0, abs=1e-12)
    assert int(masked.is_limited) == 2


@pytest.mark.parametrize("loss_type", ["grpo", "dapo", "dr_grpo", "gspo"])
@pytest.mark.parametrize("moved", [0.0, 0.3, -0.4])
def test_behaviour_equal_to_proximal_is_plain_grpo(loss_type: str, moved: float) -> None:
    """When the sampler's logprobs are the proximal ones (no staleness, no mismatch) the
    decoupled loss and its gradient are exactly the uncorrected loss's."""
    advantages = torch.tensor([0.7, -1.3])
    loss = PolicyLoss(loss_type=loss_type)  # type: ignore[arg-type]
    corrected, plain = learner(PROXIMAL + moved), learner(PROXIMAL + moved)
    a = policy_loss(
        corrected, advantages, MASK, loss, old_logprobs_BT=PROXIMAL, sampler_logprobs_BT=PROXIMAL
    )
    b = policy_loss(plain, advantages, MASK, loss, old_logprobs_BT=PROXIMAL)
    assert float(a.detach()) == pytest.approx(float(b.detach()), abs=1e-12)
    a.backward()
    b.backward()
    assert corrected.grad is not None and plain.grad is not None
    assert torch.allclose(corrected.grad, plain.grad, atol=1e-12)
