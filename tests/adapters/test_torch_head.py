"""The LM head a chunk of positions at a time: the same logprobs and gradients as one pass,
no logits tensor wider than the chunk, and models that change their logits after the head
keep the one-pass computation."""

from __future__ import annotations

from typing import Any

import pytest

from nemogym_sdk import Rollout, SamplingParams, collate
from nemogym_sdk.adapters.torch import token_logprobs
from nemogym_sdk.adapters.torch.head import split_head

from .conftest import PAD, lora_policy, rollout, torch

PROCESSINGS = [SamplingParams(), SamplingParams(temperature=0.7, top_p=0.9)]


def _rows(lengths: list[int], seed: int = 0) -> list[Rollout]:
    generator = torch.Generator().manual_seed(seed)
    return [
        rollout(
            torch.randint(0, 256, (3 + i,), generator=generator).tolist(),
            torch.randint(0, 256, (n,), generator=generator).tolist(),
            [1] * n,
            row=f"r{i}",
        )
        for i, n in enumerate(lengths)
    ]


def _logprobs_and_grads(
    model: Any, rows: list[Rollout], sampling: SamplingParams, head_chunk: int | None
) -> tuple[Any, dict[str, Any]]:
    """Logprobs, and the gradient of a fixed random weighting of them, per trainable tensor."""
    model.zero_grad(set_to_none=True)
    batch = collate(rows, pad_token_id=PAD)
    logprobs = token_logprobs(model, batch, sampling=sampling, head_chunk=head_chunk)
    weights = torch.randn(logprobs.shape, generator=torch.Generator().manual_seed(7))
    finite = torch.where(logprobs.isfinite(), logprobs, torch.zeros_like(logprobs))  # top-p cuts
    (finite * weights).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return logprobs.detach(), grads


def _close(got: Any, want: Any, rel: float) -> None:
    """Equal within ``rel`` of the largest magnitude; -inf (outside top-p) at the same places."""
    assert torch.equal(got.isfinite(), want.isfinite())
    got, want = got[want.isfinite()], want[want.isfinite()]
    scale = float(want.abs().max())
    assert float((got - want).abs().max()) <= rel * scale, (got - want).abs().max() / scale


@pytest.mark.parametrize("sampling", PROCESSINGS, ids=["raw", "t0.7-p0.9"])
def test_chunked_head_gives_the_one_pass_logprobs_and_gradients(sampling: SamplingParams) -> None:
    """Completions of 40 and 23 tokens through 7-position chunks: logprobs and LoRA
    gradients within 1e-6 relative of the one-pass computation."""
    model = lora_policy(perturb=0.3)
    rows = _rows([40, 23])
    assert split_head(model) is not None
    chunked, chunked_grads = _logprobs_and_grads(model, rows, sampling, head_chunk=7)
    whole, whole_grads = _logprobs_and_grads(model, rows, sampling, head_chunk=None)
    _close(chunked, whole, 1e-6)
    assert chunked_grads.keys() == whole_grads.keys() and len(whole_grads) > 0
    assert all("lora_" in name for name in whole_grads)  # only the adapter trains
    for name, grad in whole_grads.items():
        _close(chunked_grads[name], grad, 1e-6)


def test_no_pass_through_the_head_is_wider_than_the_chunk() -> None:
    """The LM head sees at most ``head_chunk`` positions per call (the one-pass path, all of
    them): the ``[B, T, V]`` logits are never made."""
    model = lora_policy()
    split = split_head(model)
    assert split is not None
    widths: list[int] = []
    hook = split[1].register_forward_hook(lambda _m, inputs, _o: widths.append(inputs[0].shape[1]))
    try:
        batch = collate(_rows([64, 50]), pad_token_id=PAD)
        with torch.no_grad():
            token_logprobs(model, batch, head_chunk=16)
            assert widths and max(widths) == 16
            widths.clear()
            token_logprobs(model, batch, head_chunk=None)
            assert widths == [65]  # logits_to_keep: the completion's 64 positions and one
    finally:
        hook.remove()


class _Scaled(torch.nn.Module):
    """A causal LM that changes its logits after the head (as soft-capping does)."""

    def __init__(self, inner: Any) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, **kwargs: Any) -> Any:
        out = self.inner(**kwargs)
        out.logits = 30.0 * torch.tanh(out.logits / 30.0) * 2.0
        return out

    def get_decoder(self) -> Any:
        return self.inner.get_decoder()

    def get_output_embeddings(self) -> Any:
        return self.inner.get_output_embeddings()


def test_a_model_that_changes_its_logits_after_the_head_keeps_one_pass() -> None:
    """``split_head`` declines a model whose logits are not its head's output, and
    ``token_logprobs`` with a chunk then gives that model's own logprobs."""
    from nemogym_sdk.serve.tiny import build_tiny_model

    from .test_torch_logprobs import unpadded

    model = _Scaled(build_tiny_model(0))
    assert split_head(model) is None
    rows = _rows([30])
    with torch.no_grad():
        got = token_logprobs(model, collate(rows, pad_token_id=PAD), head_chunk=4)
        plain = token_logprobs(model.inner, collate(rows, pad_token_id=PAD), head_chunk=4)
    torch.testing.assert_close(got[0], unpadded(model, rows[0]), atol=2e-5, rtol=0)
    assert float((got - plain).abs().max()) > 1e-3  # the transform after the head counts


def test_head_chunk_must_be_positive() -> None:
    from nemogym_sdk.errors import ConfigError

    with pytest.raises(ConfigError, match="head_chunk must be >= 1, got 0"):
        token_logprobs(lora_policy(), collate(_rows([3]), pad_token_id=PAD), head_chunk=0)
