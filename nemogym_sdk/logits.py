"""Logit processing shared by the sampler and the learner (imports torch).

A sampler with temperature ``tau``, top-k ``k`` and top-p ``p`` draws each token from

    q = softmax(process(logits))    process: divide by tau, keep the k largest, then keep the
                                    smallest set of most likely tokens whose mass reaches p

and a learner that corrects for the sampler (GRPO's importance ratios) must compare its own
probabilities with ``q``, not with ``softmax(logits)``. vLLM reports either
(``--logprobs-mode``):

* ``raw_logprobs`` (its default): ``log_softmax(logits)``, whatever the sampling parameters;
* ``processed_logprobs``: ``log_softmax(process(logits))``, the distribution actually sampled
  from, renormalised over the kept tokens (tokens outside it get ``-inf``; JSON carries -9999.0).

`process_logits` is the one implementation of ``process``: `nemogym_sdk.serve` samples with it and
`nemogym_sdk.adapters.torch` recomputes the learner's logprobs with it, so both sides agree. (It
lives beside the package's core, not in either of them: neither side imports the other.)
Greedy decoding (temperature 0) is not a distribution; its processed logprobs are the raw ones.
"""

from __future__ import annotations

import torch

__all__ = ["is_greedy", "process_logits"]

_GREEDY_BELOW = 1e-5


def is_greedy(temperature: float) -> bool:
    """Whether a temperature means greedy decoding (vLLM's threshold)."""
    return temperature < _GREEDY_BELOW


def process_logits(
    logits_NV: torch.Tensor, *, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0
) -> torch.Tensor:
    """Return the logits a sampler draws from: scaled by temperature, cut to top-k, then top-p.

    Works on any leading shape ``[..., V]``; removed tokens become ``-inf``. Top-p keeps every
    token whose strictly-more-likely mass is below ``top_p`` (so the most likely token always
    stays). With temperature 0 (greedy) the logits are returned unscaled and untruncated.
    """
    if is_greedy(temperature):
        return logits_NV
    scaled_NV = logits_NV / temperature if temperature != 1.0 else logits_NV
    vocab = scaled_NV.shape[-1]
    if 0 < top_k < vocab:
        kth_N1 = torch.topk(scaled_NV, top_k, dim=-1).values[..., -1:]
        scaled_NV = scaled_NV.masked_fill(scaled_NV < kth_N1, float("-inf"))
    if top_p < 1.0:
        sorted_NV, order_NV = torch.sort(scaled_NV, dim=-1, descending=True)
        probs_NV = torch.softmax(sorted_NV, dim=-1)
        before_NV = torch.cumsum(probs_NV, dim=-1) - probs_NV  # mass strictly above each token
        sorted_NV = sorted_NV.masked_fill(before_NV >= top_p, float("-inf"))
        scaled_NV = torch.full_like(scaled_NV, float("-inf")).scatter(-1, order_NV, sorted_NV)
    return scaled_NV
