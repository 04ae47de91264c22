"""An episode the chat template forked (``history="template"``, parsed with
``DriftPolicy.FORK``): its traces are rows that share the episode's reward and advantage,
count once in the group baseline, and train every generated token exactly once, with the
weight it has when the same episode is one contiguous row. Checked against hand computations
of the loss and its gradient, and through ``train_step`` on a real (tiny) model.

The episode, in the byte tokenizer's ids: turn 1 answers ``<t>x</t>ok``; the template renders
it back without its reasoning, ``ok``, so turn 2's prompt does not extend turn 1's tokens."""

from __future__ import annotations

import numpy as np
import pytest

from nemogym_sdk import DriftPolicy, SamplingParams, collate, parse_agent_response
from nemogym_sdk.adapters.torch import (
    PolicyLoss,
    episode_tokens,
    policy_loss,
    token_logprobs,
    train_step,
)
from nemogym_sdk.grpo import compute_advantages

from .conftest import PAD, lora_policy, rollout, torch

EOS = 258
PROMPT_1 = [257, 117, 10, 104, 105, EOS, 10, 257, 97, 10]  # <s>u\nhi<e>\n<s>a\n
GENERATION_1 = [*b"<t>x</t>ok", EOS]
PROMPT_2 = [*PROMPT_1, *b"ok", EOS, 10, 257, 117, 10, *b"more", EOS, 10, 257, 97, 10]
GENERATION_2 = [*b"no", EOS]
SAMPLED_1 = [-0.5 - 0.1 * i for i in range(len(GENERATION_1))]
SAMPLED_2 = [-0.3 - 0.2 * i for i in range(len(GENERATION_2))]


def tensor(values: object, dtype: torch.dtype | None = None) -> torch.Tensor:
    """A tensor of a copy (the SDK's arrays are read-only)."""
    return torch.tensor(np.array(values), dtype=dtype)


def _turn(prompt: list[int], generation: list[int], logprobs: list[float]) -> dict[str, object]:
    text = {"type": "output_text", "text": "ok", "annotations": []}
    return {
        "type": "message",
        "role": "assistant",
        "content": [text],
        "prompt_token_ids": prompt,
        "generation_token_ids": generation,
        "generation_log_probs": logprobs,
    }


def forked_episode(reward: float, repeat: int) -> object:
    """The two-turn episode, parsed with FORK: the rollout and its one fork."""
    result = {
        "responses_create_params": {"input": "hi"},
        "response": {
            "output": [
                _turn(PROMPT_1, GENERATION_1, SAMPLED_1),
                _turn(PROMPT_2, GENERATION_2, SAMPLED_2),
            ]
        },
        "reward": reward,
    }
    return parse_agent_response(
        result, EOS, on_drift=DriftPolicy.FORK, row_id="r0", repeat_index=repeat
    )


def group() -> list[object]:
    """One group of the row: the forked episode (reward 1) and a plain one (reward 0)."""
    plain = rollout([257, 117, 10, 104, 105], [*b"yes", EOS], [1, 1, 1, 1], repeat=1)
    return [forked_episode(1.0, 0), plain]


def test_the_fork_is_two_traces_each_on_the_prompt_it_was_sampled_from() -> None:
    episode = forked_episode(1.0, 0)
    traces = episode.samples()  # type: ignore[attr-defined]
    assert [list(t.prompt_ids) for t in traces] == [PROMPT_1, PROMPT_2]
    assert [list(t.completion_ids) for t in traces] == [GENERATION_1, GENERATION_2]
    trained = [int(i) for t in traces for i in np.asarray(t.completion_ids)[t.env_mask == 1]]
    assert trained == GENERATION_1 + GENERATION_2  # every generated token exactly once
    assert [t.reward for t in traces] == [1.0, 1.0]


def test_the_traces_share_one_advantage_and_count_once_in_the_baseline() -> None:
    batch = collate(group(), pad_token_id=PAD)  # type: ignore[arg-type]
    assert list(batch.episode_index) == [0, 0, 1]
    advantages = compute_advantages(batch).values
    # two episodes, rewards 1 and 0: mean 0.5, so +a and -a; counting the fork twice would
    # make the mean 2/3 and the advantages unequal in size
    assert advantages[0] == advantages[1] == -advantages[2] and advantages[0] > 0


def hand_loss(loss_type: str, logprobs_BT: torch.Tensor, batch: object) -> torch.Tensor:
    """The loss written out per episode: each token's term ``-A w`` (on-policy ratio 1, IS
    weight ``w = exp(logp - sampler)`` truncated at 2), averaged as the loss type says, with
    episode E0 = rows 0 and 1 and episode E1 = row 2."""
    mask = tensor(batch.loss_mask).bool()  # type: ignore[attr-defined]
    sampler = tensor(batch.logprobs, dtype=torch.float64)  # type: ignore[attr-defined]
    advantages = tensor(compute_advantages(batch).values, dtype=torch.float64)  # type: ignore[arg-type]
    weights = torch.exp(logprobs_BT.detach() - sampler).clamp(max=2.0)
    terms = -advantages[:, None] * weights * torch.exp(logprobs_BT - logprobs_BT.detach())
    episodes = [[0, 1], [2]]
    sums = [sum(terms[b][mask[b]].sum() for b in rows) for rows in episodes]
    counts = [sum(int(mask[b].sum()) for b in rows) for rows in episodes]
    if loss_type == "grpo":
        return sum(s / n for s, n in zip(sums, counts, strict=True)) / len(episodes)
    if loss_type == "dapo":
        return sum(sums) / sum(counts)
    assert loss_type == "dr_grpo"
    return sum(sums) / (len(episodes) * 32)  # max_completion_length 32


@pytest.mark.parametrize("loss_type", ["grpo", "dapo", "dr_grpo"])
def test_the_loss_and_its_gradient_equal_the_hand_computation(loss_type: str) -> None:
    batch = collate(group(), pad_token_id=PAD)  # type: ignore[arg-type]
    generator = torch.Generator().manual_seed(0)
    values = -torch.rand(batch.completion_ids.shape, generator=generator, dtype=torch.float64)
    loss = PolicyLoss(loss_type=loss_type, max_completion_length=32, is_cap=2.0)  # type: ignore[arg-type]
    mask = tensor(batch.loss_mask)
    ours_in = values.clone().requires_grad_(True)
    ours = policy_loss(
        ours_in,
        tensor(compute_advantages(batch).values),
        mask,
        loss,
        sampler_logprobs_BT=tensor(batch.logprobs),
        episode_tokens_B=episode_tokens(tensor(batch.episode_index), mask),
    )
    ours.backward()
    hand_in = values.clone().requires_grad_(True)
    hand = hand_loss(loss_type, hand_in, batch)
    hand.backward()
    torch.testing.assert_close(ours, hand, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(ours_in.grad, hand_in.grad, rtol=1e-12, atol=1e-12)
    # every policy token has a gradient, every other position none
    assert torch.equal(ours_in.grad != 0, mask.bool())


@pytest.mark.parametrize("loss_type", ["grpo", "dapo", "dr_grpo"])
def test_a_forked_episode_weighs_what_it_weighs_unforked(loss_type: str) -> None:
    """The same per-token values as one contiguous row (the policy tokens of both traces in
    one completion): the same loss. Without the episode counts, grpo would average the fork's
    traces as two sequences and count the episode twice."""
    batch = collate(group(), pad_token_id=PAD)  # type: ignore[arg-type]
    advantages = tensor(compute_advantages(batch).values)
    loss = PolicyLoss(loss_type=loss_type, max_completion_length=32, is_cap=2.0)  # type: ignore[arg-type]
    mask = tensor(batch.loss_mask).bool()
    values = -torch.rand(mask.shape, generator=torch.Generator().manual_seed(1))
    forked = policy_loss(
        values,
        advantages,
        mask,
        loss,
        episode_tokens_B=episode_tokens(tensor(batch.episode_index), mask),
    )
    joined = torch.cat([values[0][mask[0]], values[1][mask[1]]])
    width = max(len(joined), int(mask[2].sum()))
    one_row = torch.zeros((2, width))
    one_mask = torch.zeros((2, width), dtype=torch.bool)
    one_row[0, : len(joined)], one_mask[0, : len(joined)] = joined, True
    n = int(mask[2].sum())
    one_row[1, :n], one_mask[1, :n] = values[2][mask[2]], True
    unforked = policy_loss(one_row, advantages[[0, 2]], one_mask, loss)
    torch.testing.assert_close(forked, unforked)
    if loss_type == "grpo":  # rows as sequences: a different (wrong) loss
        rows = policy_loss(values, advantages, mask, loss)
        assert not torch.isclose(rows, unforked)


def test_train_step_trains_the_traces_as_the_hand_computation_says() -> None:
    """train_step on a tiny LoRA policy, one row per micro-batch (the fork's traces in
    different passes): its loss equals the hand computation on the model's own logprobs."""
    batch = collate(group(), pad_token_id=PAD)  # type: ignore[arg-type]
    model = lora_policy(perturb=0.2)
    with torch.no_grad():
        logprobs = token_logprobs(model, batch).to(torch.float64)
    expected = float(hand_loss("grpo", logprobs, batch))
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.0)
    metrics = train_step(
        model,
        optimizer,
        batch,
        compute_advantages(batch),
        loss=PolicyLoss(loss_type="grpo", is_cap=2.0),
        micro_batch_size=1,
        sampling=SamplingParams(),
        max_grad_norm=None,
    )
    assert metrics.rows == 3 and metrics.micro_batches == 3
    assert metrics.loss == pytest.approx(expected, rel=1e-5, abs=1e-7)
