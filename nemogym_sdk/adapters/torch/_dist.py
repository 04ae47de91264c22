"""The few collective operations `train_step` and `compute_advantages` need, as no-ops in a
single process."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
import torch.distributed as dist

__all__ = ["all_gather_array", "all_reduce_grads", "all_reduce_values", "world_size"]

_BUCKET = 1 << 24  # elements per all-reduce of flattened gradients


def world_size() -> int:
    """Processes in the default group (1 when torch.distributed is not initialised)."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size()
    return 1


def all_gather_array(values: npt.ArrayLike, *, group: Any = None) -> npt.NDArray[np.float64]:
    """Every rank's 1-D float64 ``values`` concatenated in rank order (lengths may differ).

    The ``gather`` hook of ``nemogym_sdk.compute_advantages`` under ``torch.distributed``
    (``gather=all_gather_array``), so that its batch statistics span every rank's batch.
    Every rank of ``group`` (default: the default group) must call it; without a process
    group it returns a copy of ``values``. Values travel as float64, unchanged; on NCCL
    through the current CUDA device.
    """
    local = np.array(values, dtype=np.float64).reshape(-1)
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size(group) == 1:
        return local
    ranks = dist.get_world_size(group)
    device = torch.device("cpu")
    if dist.get_backend(group) == "nccl":
        device = torch.device("cuda", torch.cuda.current_device())
    size = torch.tensor([local.shape[0]], dtype=torch.int64, device=device)
    sizes = [torch.zeros_like(size) for _ in range(ranks)]
    dist.all_gather(sizes, size, group=group)
    counts = [int(s.item()) for s in sizes]
    padded = torch.zeros(max(counts), dtype=torch.float64, device=device)
    padded[: local.shape[0]] = torch.from_numpy(local).to(device)
    parts = [torch.empty_like(padded) for _ in range(ranks)]
    dist.all_gather(parts, padded, group=group)
    return np.concatenate(
        [part[:count].cpu().numpy() for part, count in zip(parts, counts, strict=True)]
    )


def all_reduce_values(
    values: Sequence[float], op: dist.ReduceOp.RedOpType, device: torch.device, *, enabled: bool
) -> list[float]:
    """Reduce a few numbers across ranks (float64, so counts stay exact)."""
    if not enabled or world_size() == 1:
        return [float(v) for v in values]
    tensor = torch.tensor(list(values), dtype=torch.float64, device=device)
    dist.all_reduce(tensor, op=op)
    return [float(v) for v in tensor.tolist()]


def all_reduce_grads(parameters: Iterable[torch.nn.Parameter], *, enabled: bool) -> None:
    """Sum every trainable parameter's gradient over ranks, in flattened buckets.

    A parameter without a gradient on this rank (no rows reached it) contributes zeros, so
    every rank issues the same collectives in the same order.
    """
    if not enabled or world_size() == 1:
        return
    params = [p for p in parameters if p.requires_grad]
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    by_key: dict[tuple[torch.dtype, torch.device], list[torch.nn.Parameter]] = {}
    for p in params:
        by_key.setdefault((p.dtype, p.device), []).append(p)
    for group in by_key.values():
        bucket: list[torch.nn.Parameter] = []
        size = 0
        for p in group:
            bucket.append(p)
            size += p.numel()
            if size >= _BUCKET:
                _reduce_bucket(bucket)
                bucket, size = [], 0
        if bucket:
            _reduce_bucket(bucket)


def _reduce_bucket(bucket: list[torch.nn.Parameter]) -> None:
    grads = [p.grad for p in bucket if p.grad is not None]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    offset = 0
    for g in grads:
        n = g.numel()
        g.copy_(flat[offset : offset + n].view_as(g))
        offset += n
