"""``train_step`` on two real ranks (gloo on 127.0.0.1, CPU) equals one process.

Each rank trains on its shard of whole groups; the step all-reduces normalisers, metrics
and gradients. The summed gradient must equal one process's gradient on the concatenated
batch (other micro-batches, so another summation order: relative error below 1e-5 of the
largest gradient entry), the metrics must be the whole batch's, and after a few Adam steps
both ranks must hold bit-for-bit identical, changed weights.
"""

from __future__ import annotations

import copy
import datetime
import hashlib
import json
import socket
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from nemogym_sdk import Rollout, SamplingParams, collate, compute_advantages  # noqa: E402

from .conftest import PAD, lora_policy, rollout  # noqa: E402

SAMPLING = SamplingParams(temperature=1.0)


def shard(rank: int) -> list[Rollout]:
    """Two groups of four rollouts per rank: random prompts and completions with an
    environment segment in the middle, rewards that differ within each group."""
    rng = np.random.default_rng(7 + rank)
    out = []
    for group in range(2):
        for repeat in range(4):
            prompt = rng.integers(3, 250, size=int(rng.integers(2, 6))).tolist()
            n = int(rng.integers(3, 9))
            mask = [1] * n
            mask[n // 2] = 0
            out.append(
                rollout(
                    prompt,
                    rng.integers(3, 250, size=n).tolist(),
                    mask,
                    row=f"rank{rank}:g{group}",
                    repeat=repeat,
                    reward=float(rng.random()),
                )
            )
    return out


def digest(model: Any) -> str:
    h = hashlib.sha256()
    for name, param in sorted(model.named_parameters()):
        if param.requires_grad:
            h.update(name.encode() + param.detach().contiguous().numpy().tobytes())
    return h.hexdigest()


def _step(model: Any, optimizer: Any, rollouts: list[Rollout], **options: Any) -> Any:
    from nemogym_sdk.adapters.torch import train_step

    batch = collate(rollouts, pad_token_id=PAD)
    return train_step(
        model, optimizer, batch, compute_advantages(batch), sampling=SAMPLING, **options
    )


def join_gloo(rank: int, port: int, seconds: float = 60) -> Any:
    """Join the two-rank gloo group on 127.0.0.1:``port``; ``torch.distributed``."""
    import torch.distributed as dist

    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=2,
        timeout=datetime.timedelta(seconds=seconds),
    )
    return dist


def worker(rank: int, port: int, out: str) -> None:
    dist = join_gloo(rank, port)
    try:
        model = lora_policy(0, perturb=0.05)  # B nonzero: every LoRA weight gets a gradient
        reference = copy.deepcopy(model)
        initial = digest(model)
        frozen = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.0)
        metrics = _step(model, frozen, shard(rank), micro_batch_size=3)
        # one process, the whole batch, other micro-batches, no collectives
        alone = torch.optim.SGD([p for p in reference.parameters() if p.requires_grad], lr=0.0)
        whole = _step(reference, alone, shard(0) + shard(1), micro_batch_size=5, distributed=False)
        mine = dict(model.named_parameters())
        worst = scale = 0.0
        for name, param in reference.named_parameters():
            if param.grad is not None:
                got = mine[name].grad
                assert got is not None, name
                worst = max(worst, float((got - param.grad).abs().max()))
                scale = max(scale, float(param.grad.abs().max()))
        adam = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-2)
        for _ in range(3):
            _step(model, adam, shard(rank))
        result = {
            "max_abs_diff": worst,
            "max_abs_grad": scale,
            "tokens": [metrics.tokens, whole.tokens],
            "loss": [metrics.loss, whole.loss],
            "initial": initial,
            "final": digest(model),
        }
        Path(out, f"rank{rank}.json").write_text(json.dumps(result))
    finally:
        dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_two_ranks_match_one_process(tmp_path: Path) -> None:
    torch.multiprocessing.spawn(worker, args=(free_port(), str(tmp_path)), nprocs=2, join=True)
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    for result in results:
        assert result["max_abs_grad"] > 0
        assert result["max_abs_diff"] <= 1e-5 * result["max_abs_grad"], result
        assert result["tokens"][0] == result["tokens"][1]  # reduced over ranks: the whole batch
        assert result["loss"][0] == pytest.approx(result["loss"][1], rel=1e-5)
    assert results[0]["final"] == results[1]["final"] != results[0]["initial"]
