"""``train_step`` on a policy sharded over two ranks with FSDP2 (gloo on 127.0.0.1, CPU)
equals one process with the whole model.

Each rank holds half of every parameter and trains on its own shard of whole groups, with
a different number of micro-batches than the other (rank 1 runs an empty pass so FSDP's
gathers line up). The gradient, gathered in full, must equal one unsharded process's on the
concatenated batch (relative error below 1e-5 of the largest entry); the adapter gathered
for the sampler (``full_state_dict``) must equal the unsharded model's after a few Adam steps
on both.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from .conftest import lora_policy  # noqa: E402
from .test_torch_two_rank_step import _step, free_port, join_gloo, shard  # noqa: E402


def worker(rank: int, port: int, out: str) -> None:
    from nemogym_sdk.adapters.torch.sharding import full_state_dict, is_sharded
    from nemogym_sdk.adapters.torch.sharding import shard as fsdp

    dist = join_gloo(rank, port, seconds=120)
    try:
        model = lora_policy(0, perturb=0.05)
        reference = copy.deepcopy(model)
        fsdp(model)
        assert is_sharded(model)
        frozen = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.0)
        # rank 0: 8 rows in 3 passes; rank 1: its first group only, 4 rows in 2 passes
        mine = shard(rank) if rank == 0 else shard(1)[:4]
        metrics = _step(model, frozen, mine, micro_batch_size=3)
        alone = torch.optim.SGD([p for p in reference.parameters() if p.requires_grad], lr=0.0)
        whole = _step(
            reference, alone, shard(0) + shard(1)[:4], micro_batch_size=5, distributed=False
        )
        grads = {n: p.grad.full_tensor() for n, p in model.named_parameters() if p.grad is not None}
        worst = scale = 0.0
        for name, param in reference.named_parameters():
            if param.grad is not None:
                worst = max(worst, float((grads[name] - param.grad).abs().max()))
                scale = max(scale, float(param.grad.abs().max()))
        adam = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-2)
        adam_ref = torch.optim.Adam([p for p in reference.parameters() if p.requires_grad], lr=1e-2)
        for _ in range(2):
            _step(model, adam, mine, micro_batch_size=3)
            _step(reference, adam_ref, shard(0) + shard(1)[:4], distributed=False)
        gathered = full_state_dict(model)  # every rank calls it; rank 0 gets it
        drift = 0.0
        if rank == 0:
            expected = reference.state_dict()
            drift = max(
                float((gathered[k] - expected[k]).abs().max()) for k in expected if "lora_" in k
            )
        result = {
            "max_abs_diff": worst,
            "max_abs_grad": scale,
            "tokens": [metrics.tokens, whole.tokens],
            "loss": [metrics.loss, whole.loss],
            "gathered_keys": len(gathered),
            "adapter_drift": drift,
        }
        Path(out, f"rank{rank}.json").write_text(json.dumps(result))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def test_a_sharded_policy_trains_like_one_process(tmp_path: Path) -> None:
    torch.multiprocessing.spawn(worker, args=(free_port(), str(tmp_path)), nprocs=2, join=True)
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    for result in results:
        assert result["max_abs_grad"] > 0
        assert result["max_abs_diff"] <= 1e-5 * result["max_abs_grad"], result
        assert result["tokens"][0] == result["tokens"][1]
        assert result["loss"][0] == pytest.approx(result["loss"][1], rel=1e-5)
    assert results[0]["gathered_keys"] > 0 and results[1]["gathered_keys"] == 0
    assert results[0]["adapter_drift"] < 1e-4, results[0]
