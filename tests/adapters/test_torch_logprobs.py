"""token_logprobs: one padded forward equals a forward per unpadded row, at any padding."""

from __future__ import annotations

import subprocess
import sys

from nemogym_sdk import Rollout, SamplingParams, collate
from nemogym_sdk.adapters.torch import token_logprobs

from .conftest import PAD, lora_policy, torch


def unpadded(model: object, row: Rollout, *, temperature: float = 1.0) -> torch.Tensor:
    """Reference: the row alone, no padding, no masks; log_softmax(logits / temperature)."""
    prompt, completion = row.prompt_ids.tolist(), row.completion_ids.tolist()
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + completion])).logits[0].float()  # type: ignore[operator]
    logprobs = torch.log_softmax(logits / temperature, dim=-1)
    return torch.tensor(
        [float(logprobs[len(prompt) - 1 + t, tok]) for t, tok in enumerate(completion)]
    )


def test_matches_a_forward_per_unpadded_row(rollouts: list[Rollout]) -> None:
    """Left-padded prompts and right-padded completions give each row its unpadded logprobs,
    and padded completion positions are exactly 0."""
    model = lora_policy(perturb=0.3)
    batch = collate(rollouts, pad_token_id=PAD)
    with torch.no_grad():
        got = token_logprobs(model, batch)
    assert got.shape == batch.completion_ids.shape and got.dtype == torch.float32
    for b, row in enumerate(rollouts):
        n = len(row.completion_ids)
        torch.testing.assert_close(got[b, :n], unpadded(model, row), atol=2e-5, rtol=0)
        assert torch.all(got[b, n:] == 0)


def test_padding_and_chunking_change_nothing(rollouts: list[Rollout]) -> None:
    """Extra padding (multiples of 32) and any chunk size give the same logprobs."""
    model = lora_policy(perturb=0.3)
    tight = collate(rollouts, pad_token_id=PAD)
    loose = collate(rollouts, pad_token_id=PAD, pad_to_multiple_of=32)
    with torch.no_grad():
        reference = token_logprobs(model, tight, chunk_size=None)
        for chunk in (1, 2):
            torch.testing.assert_close(
                token_logprobs(model, tight, chunk_size=chunk), reference, atol=2e-5, rtol=0
            )
        padded = token_logprobs(model, loose, chunk_size=2)
    T = tight.completion_ids.shape[1]
    torch.testing.assert_close(padded[:, :T], reference, atol=2e-5, rtol=0)
    assert torch.all(padded[:, T:] == 0)


def test_temperature_scales_the_logits(rollouts: list[Rollout]) -> None:
    """temperature=0.7 gives log_softmax(logits / 0.7), not the raw log-softmax."""
    model = lora_policy(perturb=0.3)
    batch = collate(rollouts[:1], pad_token_id=PAD)
    with torch.no_grad():
        got = token_logprobs(model, batch, sampling=SamplingParams(temperature=0.7))[0]
    torch.testing.assert_close(
        got, unpadded(model, rollouts[0], temperature=0.7), atol=2e-5, rtol=0
    )
    assert not torch.allclose(got, unpadded(model, rollouts[0]), atol=1e-3)


def test_accepts_to_torch_tensors_and_keeps_gradients(rollouts: list[Rollout]) -> None:
    """The tensors of Batch.to_torch() work too, and outside no_grad the result has a graph."""
    model = lora_policy()
    tensors = collate(rollouts, pad_token_id=PAD).to_torch()
    got = token_logprobs(model, tensors)
    assert got.requires_grad
    got.sum().backward()
    assert any(p.grad is not None for n, p in model.named_parameters() if "lora_A" in n)


def test_missing_torch_names_the_extra() -> None:
    """Without torch, importing the adapter fails with an ImportError naming the pip extra."""
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "try:\n    import nemogym_sdk.adapters.torch\n"
        "except ImportError as e:\n    print(e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "pip install 'nemogym-sdk[torch]'" in out.stdout
