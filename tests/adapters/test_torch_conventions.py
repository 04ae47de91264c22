"""The torch rows of ``docs/training.md``'s GRPO conventions table, one test per row.

TRL's side is transcribed from TRL 1.16's ``GRPOTrainer`` (``trl/trainer/grpo_trainer.py``:
``_compute_loss`` for the aggregation and normalisers, ``_generate_and_score_completions`` for
the vLLM importance-sampling modes) in a few lines of torch beside each check. The numpy rows
(advantages) are ``tests/test_grpo_conventions.py``.
"""

from __future__ import annotations

import inspect
import math

import attrs
import numpy as np
import pytest

from nemogym_sdk import Rollout, RolloutStatus, SamplingParams, collate
from nemogym_sdk.adapters.torch import (
    ImportanceSampling,
    PolicyLoss,
    learner_processing,
    loss_normalizer,
    policy_loss,
    policy_loss_terms,
    policy_span,
    token_logprobs,
    train_step,
)
from nemogym_sdk.errors import ConfigError
from nemogym_sdk.logits import process_logits
from nemogym_sdk.serve.tiny import build_tiny_model

from .conftest import PAD, lora_policy, rollout, torch

PLAIN = SamplingParams()
ADVANTAGES = np.array([1.0, -0.5, 0.25], dtype=np.float32)
MASK = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 0], [0, 0, 0, 0]])
"""Rows with two and three policy tokens, and a row with none (all environment tokens)."""
ADV = torch.tensor([1.0, -0.5, 2.0], dtype=torch.float64)
LOGPROBS = torch.tensor(
    [[-1.0, -2.0, -3.0, -4.0], [-0.5, -1.5, -2.5, -3.5], [-1.0, -1.0, -1.0, -1.0]],
    dtype=torch.float64,
)


def trl_aggregate(
    per_token_loss: torch.Tensor, mask: torch.Tensor, loss_type: str, L: int = 0
) -> float:
    """TRL's ``_compute_loss`` aggregation of one micro-batch (no accumulation)."""
    m = mask.to(per_token_loss.dtype)
    if loss_type == "grpo":
        return float(((per_token_loss * m).sum(-1) / m.sum(-1).clamp(min=1.0)).mean())
    if loss_type == "dr_grpo":
        return float((per_token_loss * m).sum() / (per_token_loss.size(0) * L))
    return float((per_token_loss * m).sum() / m.sum().clamp(min=1.0))  # dapo


def sgd(model: torch.nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.0)


def test_convention_failed_rows_leave_the_loss(rollouts: list[Rollout]) -> None:
    """TRL keeps an unscorable row in the loss with advantage 0: its tokens count in the dapo
    normaliser, its row in grpo's and dr_grpo's, and it gets a KL gradient. ``train_step``
    drops every row that is not OK, and ``Batch.loss_mask`` is 0 on it: a DRIFT row of 3
    policy tokens and a MASKED row leave tokens (10), rows (3) and the loss as they were."""
    drift = rollout([257, 1, 2], [3, 4, 5], [1, 1, 1], row="r1", status=RolloutStatus.DRIFT)
    masked = rollout([257, 6], [7, 8], [1, 0], row="r2", status=RolloutStatus.MASKED)
    model = lora_policy(perturb=0.2)
    batch = collate([*rollouts, drift, masked], pad_token_id=PAD)
    assert (
        batch.loss_mask[3:].sum() == 0 and (batch.completion_mask * batch.env_mask)[3:].sum() == 4
    )
    advantages = np.array([*ADVANTAGES, 5.0, -3.0], dtype=np.float32)
    with_failures = train_step(model, sgd(model), batch, advantages, sampling=PLAIN)
    alone = train_step(
        model, sgd(model), collate(rollouts, pad_token_id=PAD), ADVANTAGES, sampling=PLAIN
    )
    assert (with_failures.tokens, with_failures.rows) == (alone.tokens, alone.rows) == (10, 3)
    assert with_failures.loss == pytest.approx(alone.loss, rel=1e-6)


@pytest.mark.parametrize(
    ("loss_type", "ours", "trl"),
    [
        # row means -1 and +0.5 (row 2 has no policy token): ours over 2 rows, TRL over 3
        ("grpo", -0.25, -1 / 6),
        ("gspo", -0.25, -1 / 6),
        # token sum -2 + 1.5 = -0.5 over rows * 4: ours 2 rows, TRL 3
        ("dr_grpo", -0.5 / 8, -0.5 / 12),
    ],
)
def test_convention_rows_without_policy_tokens(loss_type: str, ours: float, trl: float) -> None:
    """A row with no policy token (all environment tokens, or cut to nothing) does not count
    in our row normalisers; TRL's ``.mean()`` over rows and ``size(0)`` count it as a 0."""
    loss = PolicyLoss(loss_type=loss_type, max_completion_length=4)
    value = policy_loss(LOGPROBS, ADV, MASK, loss)
    assert float(value) == pytest.approx(ours, abs=1e-12)
    per_token = -ADV[:, None].expand(3, 4)  # on-policy: every ratio is 1, the term is -A
    assert trl_aggregate(
        per_token, MASK, "dr_grpo" if loss_type == "dr_grpo" else "grpo", 4
    ) == pytest.approx(trl)


def test_convention_dr_grpo_normaliser(rollouts: list[Rollout]) -> None:
    """TRL's dr_grpo divides by rows * ``max_completion_length`` (its config, default 512).
    Ours: rows in the loss * ``max_completion_length``, or without it the policy span (the
    longest completion in the loss up to its last policy token: 7 here, row r1), never the
    padded width, and never a row left out of the loss (the 12-token MASKED row). policy_loss
    and train_step give the same loss for the same batch, padded or not."""
    masked = rollout([257, 6], [9] * 12, [1] * 12, row="r9", status=RolloutStatus.MASKED)
    model = lora_policy(perturb=0.2)
    for length in (None, 20):
        loss = PolicyLoss(loss_type="dr_grpo", max_completion_length=length)
        seen = []
        for pad_to in (None, 16):
            batch = collate([*rollouts, masked], pad_token_id=PAD, pad_to_multiple_of=pad_to)
            assert policy_span(torch.tensor(batch.loss_mask)) == 7
            advantages = np.array([*ADVANTAGES, 4.0], dtype=np.float32)
            step = train_step(model, sgd(model), batch, advantages, sampling=PLAIN, loss=loss)
            with torch.no_grad():
                logprobs = token_logprobs(model, batch)
            direct = policy_loss(
                logprobs,
                torch.from_numpy(advantages),
                torch.tensor(batch.loss_mask),
                loss,
                sampler_logprobs_BT=torch.tensor(batch.logprobs),
            )
            assert step.loss == pytest.approx(float(direct), rel=1e-5)
            seen.append(step.loss)
        assert seen[0] == pytest.approx(seen[1], rel=1e-6)
    assert loss_normalizer(PolicyLoss(loss_type="dr_grpo"), 10, 3, 7) == 21.0


def test_convention_normaliser_spans_micro_batches() -> None:
    """TRL normalises grpo, dr_grpo and bnpo per micro-batch and divides by the accumulation
    steps (a mean of micro-batch means); ours divides every micro-batch by the whole batch's
    normaliser, so any split gives the full-batch loss. (dapo: both use the global token
    count.) Rows 0 | 1, 2 of MASK, grpo: ours -0.25 either way; TRL (-1 + 0.5) / 2 = -0.25
    only by luck of equal rows, here (-1/1 + (0.5 + 0)/1) / 2 = -0.25 vs split [0, 1] | [2]:
    ((-1 + 0.5) / 2 + 0 / 1) / 2 = -0.125."""
    loss = PolicyLoss(loss_type="grpo")
    whole = float(policy_loss(LOGPROBS, ADV, MASK, loss))
    parts = [
        policy_loss_terms(LOGPROBS[s], ADV[s], MASK[s], loss) for s in (slice(0, 2), slice(2, 3))
    ]
    rows = sum(float(p.rows) for p in parts)
    ours = sum(float(p.objective) for p in parts) / loss_normalizer(loss, 0.0, rows)
    assert ours == pytest.approx(whole) == pytest.approx(-0.25)
    per_token = -ADV[:, None].expand(3, 4)
    trl = np.mean(
        [trl_aggregate(per_token[s], MASK[s], "grpo") for s in (slice(0, 2), slice(2, 3))]
    )
    assert trl == pytest.approx(-0.125)


def test_convention_gspo_sequence_weight() -> None:
    """gspo's policy ratio is TRL's (``importance_sampling_level="sequence"``: exp of the
    mean log-ratio); its IS weight is not. One row, token weights w = [2, 0.5, 4], A = 1:
    ours is one weight per row, the geometric mean (2 * 0.5 * 4)^(1/3) = 1.587, capped at 3;
    TRL's token modes weight each token (the row gets mean([2, .5, 3]) = 1.833 truncated),
    its sequence modes use the product 4 (truncated to 3, or masked to 0 by the default
    ``sequence_mask``)."""
    weights = torch.tensor([[2.0, 0.5, 4.0]], dtype=torch.float64)
    sampler = -torch.log(weights)  # old = 0 on-policy, so w = exp(0 - sampler)
    terms = policy_loss_terms(
        torch.zeros((1, 3), dtype=torch.float64),
        torch.tensor([1.0]),
        torch.ones((1, 3)),
        PolicyLoss(loss_type="gspo"),
        sampler_logprobs_BT=sampler,
    )
    assert float(terms.objective) == pytest.approx(-(4.0 ** (1 / 3)))
    assert int(terms.is_limited) == 0
    token_truncate = float(weights.clamp(max=3.0).mean())
    sequence_product = float(weights.prod())
    assert (token_truncate, min(sequence_product, 3.0)) == pytest.approx((11 / 6, 3.0))
    assert sequence_product > 3.0  # TRL's sequence_mask drops this row entirely


def test_convention_default_is_correction() -> None:
    """Defaults: TRL ``vllm_importance_sampling_mode="sequence_mask"`` (cap 3, no floor, on the
    product of token ratios); ours ``importance_sampling="truncate"`` per token (cap 3, no
    floor), TRL's ``token_truncate``; ``"mask"`` is ``token_mask``. A row with token weights
    [2, 2]: TRL's default masks it (product 4 > 3), ours keeps both tokens at weight 2."""
    default = PolicyLoss()
    assert (default.importance_sampling, default.is_cap, default.is_floor) == (
        ImportanceSampling.TRUNCATE,
        3.0,
        None,
    )
    generator = torch.Generator().manual_seed(0)
    sampler = torch.randn((4, 6), generator=generator, dtype=torch.float64)
    for mode, trl in (
        ("truncate", lambda w: w.clamp(max=3.0)),
        ("mask", lambda w: w.masked_fill(w > 3.0, 0.0)),
    ):
        terms = policy_loss_terms(
            torch.zeros((4, 6), dtype=torch.float64),
            torch.ones(4),
            torch.ones((4, 6)),
            PolicyLoss(importance_sampling=mode),
            sampler_logprobs_BT=sampler,
        )
        assert float(terms.objective) == pytest.approx(-float(trl(torch.exp(-sampler)).sum()))
    two = torch.full((1, 2), -math.log(2.0), dtype=torch.float64)
    ours = policy_loss(
        torch.zeros((1, 2), dtype=torch.float64),
        torch.ones(1),
        torch.ones((1, 2)),
        default,
        sampler_logprobs_BT=two,
    )
    assert float(ours) == pytest.approx(-2.0)


def test_convention_is_floor() -> None:
    """``is_floor`` is TRL's ``vllm_importance_sampling_clip_min``: under ``truncate`` weights
    below it are raised to it, under ``mask`` they get 0. Weights [0.5, 2, 5], floor 0.8,
    cap 3: truncate [0.8, 2, 3] (2 limited), mask [0, 2, 0] (2 limited). For gspo the row
    weight (geometric mean 5^(1/3) = 1.71) is raised to a floor of 2. A floor at or above
    the cap is a ConfigError."""
    sampler = -torch.log(torch.tensor([[0.5, 2.0, 5.0]], dtype=torch.float64))
    zeros, ones = torch.zeros((1, 3), dtype=torch.float64), torch.ones((1, 3))
    for mode, expected in (("truncate", 0.8 + 2 + 3), ("mask", 2.0)):
        terms = policy_loss_terms(
            zeros,
            torch.ones(1),
            ones,
            PolicyLoss(importance_sampling=mode, is_floor=0.8),
            sampler_logprobs_BT=sampler,
        )
        assert float(terms.objective) == pytest.approx(-expected)
        assert int(terms.is_limited) == 2
    gspo = policy_loss_terms(
        zeros,
        torch.ones(1),
        ones,
        PolicyLoss(loss_type="gspo", is_floor=2.0),
        sampler_logprobs_BT=sampler,
    )
    assert float(gspo.objective) == pytest.approx(-2.0) and int(gspo.is_limited) == 1
    for floor in (3.0, 4.0, -0.1):
        with pytest.raises(ConfigError, match="is_floor"):
            PolicyLoss(is_floor=floor)


def test_convention_float32_logprobs(rollouts: list[Rollout]) -> None:
    """TRL projects the LM head in the model's dtype and folds the log-softmax in float32
    (``cast_lm_head_to_fp32`` runs the head in float32 too). Ours casts the logits to float32
    before temperature, top-p and the log-softmax, and the losses compute in float32 at
    least: a bf16 model gives float32 logprobs equal to log_softmax(logits.float())."""
    model = build_tiny_model(0).to(torch.bfloat16)
    row = rollouts[0]
    batch = collate([row], pad_token_id=PAD)
    with torch.no_grad():
        got = token_logprobs(model, batch)
        ids = torch.tensor([row.prompt_ids.tolist() + row.completion_ids.tolist()])
        logits = model(input_ids=ids).logits[0].float()
    assert got.dtype == torch.float32
    P = len(row.prompt_ids)
    expected = torch.log_softmax(logits, dim=-1)[P - 1 : -1].gather(
        -1, torch.tensor(row.completion_ids.tolist())[:, None]
    )[:, 0]
    torch.testing.assert_close(got[0], expected, atol=2e-2, rtol=0)
    terms = policy_loss_terms(
        got.to(torch.bfloat16), torch.ones(1), torch.ones_like(got), PolicyLoss()
    )
    assert terms.objective.dtype == torch.float32


def test_convention_learner_applies_the_sampling_settings(rollouts: list[Rollout]) -> None:
    """TRL's learner divides the logits by ``temperature`` only (top-p, top-k shape its
    sampler alone); ours applies the temperature and top-p of the ``SamplingParams`` the
    rollouts were played with, read from the one object (``train_step(sampling=...)`` is
    required). None means the API default 1.0; greedy sampling is refused; ``top_k`` is no
    setting (NeMo Gym's Responses API cannot carry it)."""
    assert learner_processing(SamplingParams()) == learner_processing(None) == (1.0, 1.0)
    assert learner_processing(SamplingParams(temperature=0.7, top_p=0.9)) == (0.7, 0.9)
    for bad in (
        SamplingParams(temperature=0.0),
        SamplingParams(top_p=0.0),
        SamplingParams(top_p=1.5),
    ):
        with pytest.raises(ConfigError):
            learner_processing(bad)
    for function in (train_step, token_logprobs):
        parameters = inspect.signature(function).parameters
        assert "top_k" not in parameters and "temperature" not in parameters
    assert inspect.signature(train_step).parameters["sampling"].default is inspect.Parameter.empty

    model = lora_policy(perturb=0.3)
    prompt = rollouts[1].prompt_ids.tolist()
    with torch.no_grad():  # a greedy completion: its tokens lie inside any nucleus
        ids = torch.tensor([prompt])
        for _ in range(5):
            ids = torch.cat([ids, model(input_ids=ids).logits[:, -1].argmax(-1, keepdim=True)], 1)
        logits = model(input_ids=ids).logits[0].float()
    completion = ids[0, len(prompt) :].tolist()
    row = rollout(prompt, completion, [1] * len(completion))
    settings = SamplingParams(temperature=0.7, top_p=0.6)
    with torch.no_grad():
        got = token_logprobs(model, collate([row], pad_token_id=PAD), sampling=settings)[0]
    P, index = len(prompt), torch.tensor(completion)[:, None]
    processed = torch.log_softmax(process_logits(logits, temperature=0.7, top_p=0.6), dim=-1)
    temperature_only = torch.log_softmax(logits / 0.7, dim=-1)
    expected = processed[P - 1 : -1].gather(-1, index)[:, 0]
    trl = temperature_only[P - 1 : -1].gather(-1, index)[:, 0]
    torch.testing.assert_close(got, expected, atol=2e-5, rtol=0)
    kept = torch.isfinite(expected)
    assert bool(kept.all()) and bool((got > trl).any())  # renormalised over the nucleus
    assert bool((got >= trl - 1e-6).all())


def test_convention_mask_truncated_reads_the_parsers_flag(rollouts: list[Rollout]) -> None:
    """TRL's ``mask_truncated_completions`` calls a completion truncated when its last token is
    neither EOS nor pad; ours reads ``Rollout.truncated``, set when the parser cut the
    completion to ``max_completion_length``. Row r0 without its EOS stays in; r1 flagged
    truncated leaves the loss."""
    no_eos = attrs.evolve(rollouts[0], completion_ids=[97, 98, 99, 97])
    cut = attrs.evolve(rollouts[1], truncated=True)
    model = lora_policy()
    batch = collate([no_eos, cut, rollouts[2]], pad_token_id=PAD)
    kept = train_step(
        model, sgd(model), batch, ADVANTAGES, sampling=PLAIN, loss=PolicyLoss(mask_truncated=True)
    )
    assert (kept.rows, kept.tokens) == (2, 6)
