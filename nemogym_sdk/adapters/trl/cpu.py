"""TRL's asynchronous trainer without a GPU: try a NeMo Gym pipeline end to end before renting one.

``AsyncGRPOTrainer`` (TRL 1.16, ``trl.experimental.async_grpo``) needs CUDA twice: its
constructor asks for the GPU's peak FLOPs (for its MFU figures), and its tree attention calls
a FlashAttention-3 kernel that it fetches from the Hugging Face Hub. `run_async_grpo_on_cpu`
replaces both, for this process, before the trainer is built::

    from nemogym_sdk.adapters.trl import run_async_grpo_on_cpu

    run_async_grpo_on_cpu()  # then AsyncGRPOConfig(..., use_cpu=True, bf16=False)

The attention is the kernel's arithmetic in plain torch (`CpuVarlenAttention`): exact,
causal attention from each packed segment to the keys of its root-to-segment path, one
segment at a time. It is slow and meant for tiny models: a pipeline's wiring, not a training
run. The peak FLOPs are unknown, TRL's answer for a device it does not list, so its MFU
figures are off and its throughput and timing figures stay. On a GPU, don't call it.
"""

from __future__ import annotations

from typing import Any

from nemogym_sdk.errors import ConfigError

__all__ = ["CpuVarlenAttention", "run_async_grpo_on_cpu"]


class CpuVarlenAttention:
    """FlashAttention's ``flash_attn_varlen_func`` for TRL's tree attention, in plain torch.

    Queries and keys are packed: segment ``i``'s queries are rows ``cu_seqlens_q[i]`` to
    ``cu_seqlens_q[i + 1]``, its keys rows ``cu_seqlens_k[i]`` to ``cu_seqlens_k[i + 1]``.
    Causal masking aligns the two at their ends (FlashAttention's ``causal`` when a segment
    has more keys than queries: its keys are its path, ending with itself). Sliding windows
    and soft-capping (models TRL's tree packing refuses anyway) are refused.
    """

    @staticmethod
    def flash_attn_varlen_func(
        query: Any,
        key: Any,
        value: Any,
        cu_seqlens_q: Any,
        cu_seqlens_k: Any,
        max_seqlen_q: int,
        max_seqlen_k: int,
        *,
        softmax_scale: float | None = None,
        causal: bool = True,
        window_size: tuple[int, int] = (-1, -1),
        **rest: Any,
    ) -> Any:
        import torch
        from torch.nn.functional import scaled_dot_product_attention

        if not causal or tuple(window_size) != (-1, -1) or rest:
            raise ConfigError(
                "CpuVarlenAttention computes causal attention without a sliding window or "
                f"soft-capping; TRL asked for causal={causal}, window_size={window_size}, "
                f"{sorted(rest)}"
            )
        out = torch.empty_like(query)
        bounds_q, bounds_k = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
        repeat = query.shape[1] // key.shape[1]  # grouped-query attention
        for q0, q1, k0, k1 in zip(bounds_q, bounds_q[1:], bounds_k, bounds_k[1:], strict=False):
            q = query[q0:q1].transpose(0, 1)
            k = key[k0:k1].repeat_interleave(repeat, dim=1).transpose(0, 1)
            v = value[k0:k1].repeat_interleave(repeat, dim=1).transpose(0, 1)
            seen = torch.ones(q1 - q0, k1 - k0, dtype=torch.bool, device=query.device)
            seen = seen.tril(diagonal=(k1 - k0) - (q1 - q0))
            attended = scaled_dot_product_attention(q, k, v, attn_mask=seen, scale=softmax_scale)
            out[q0:q1] = attended.transpose(0, 1)
        return out


def run_async_grpo_on_cpu() -> None:
    """Let TRL's ``AsyncGRPOTrainer`` run on the CPU, in this process (see the module doc).

    Raises:
        ConfigError: this TRL has no ``trl.experimental.async_grpo``, or not the two
            functions replaced (its layout changed since TRL 1.16).
    """
    try:
        from trl.experimental.async_grpo import async_grpo_trainer, packing
    except ImportError as exc:
        raise ConfigError(
            f"this TRL has no trl.experimental.async_grpo ({exc}); AsyncGRPOTrainer came with "
            "TRL 1.16: pip install 'trl>=1.16,<2'"
        ) from exc
    replaced = (  # (module, function, its replacement)
        (async_grpo_trainer, "get_peak_flops_per_device", lambda *_: None),
        (packing, "_flash_attn", lambda: CpuVarlenAttention),
    )
    for module, name, _ in replaced:
        if not callable(getattr(module, name, None)):
            raise ConfigError(
                f"{module.__name__} has no {name}(): this TRL's asynchronous trainer is laid out "
                "differently from TRL 1.16's, which run_async_grpo_on_cpu knows"
            )
    for module, name, replacement in replaced:
        setattr(module, name, replacement)
