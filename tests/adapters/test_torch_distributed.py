"""Batch statistics under torch.distributed: two real ranks (gloo on 127.0.0.1, CPU).

Each rank computes advantages on its shard of whole groups with
``gather=all_gather_array``; the result must equal, bit for bit, one process's advantages
on the concatenated batch, for every batch statistic (``scale="batch"``, GDPO's batch
normalisation). Without a hook, a batch statistic under a live process group is a
ConfigError (never a silent per-rank statistic); a rank whose data fails its checks, or
whose shard has no OK rollout, leaves no rank waiting.
"""

from __future__ import annotations

import datetime
import math
import socket
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from nemogym_sdk import ConfigError, DataError, Rollout, RolloutStatus, collate  # noqa: E402
from nemogym_sdk.grpo import compute_advantages, group_advantages  # noqa: E402
from nemogym_sdk.testing import scored_rollout  # noqa: E402

WEIGHTS = {"a": 1.0, "b": 0.5}
CASES: dict[str, dict[str, Any]] = {
    "batch": {"scale": "batch"},
    "batch_loo_weighted": {"scale": "batch", "leave_one_out": True, "reward_weights": WEIGHTS},
    "gdpo": {"aggregation": "gdpo", "reward_weights": WEIGHTS},
    "gdpo_batch_scale": {"aggregation": "gdpo", "reward_weights": WEIGHTS, "scale": "batch"},
}


def shard(rank: int) -> list[Rollout]:
    """Rank ``rank``'s whole groups: three groups of 2-5 rollouts with components a and b,
    about one in five failed (drawn from a fixed seed per rank)."""
    rng = np.random.default_rng(100 + rank)
    out: list[Rollout] = []
    for g in range(3):
        for i in range(int(rng.integers(2, 6))):
            row = f"rank{rank}:row{g}"
            if rng.random() < 0.2:
                out.append(scored_rollout(row, 0.0, repeat_index=i, status=RolloutStatus.TIMEOUT))
                continue
            a, b = float(rng.integers(0, 4)), float(rng.normal() * (1 + 2 * rank))
            rollout = scored_rollout(row, a + b, repeat_index=i)
            out.append(attrs.evolve(rollout, reward_components={"a": a, "b": b}))
    return out


def worker(rank: int, world: int, port: int, out: str) -> None:
    """One rank: every case with the hook, the refusal without it, and the failure cases."""
    import torch.distributed as dist

    from nemogym_sdk.adapters.torch import all_gather_array

    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=60),
    )
    try:
        batch = collate(shard(rank), pad_token_id=0)
        results: dict[str, Any] = {
            name: compute_advantages(batch, gather=all_gather_array, **options).values
            for name, options in CASES.items()
        }
        results["array_level"] = group_advantages(
            batch.rewards, batch.row_ids, batch.ok, scale="batch", gather=all_gather_array
        )
        results["group_without_hook"] = compute_advantages(batch).values  # needs no gather
        refusals = []
        for options in ({"scale": "batch"}, {"aggregation": "gdpo", "reward_weights": WEIGHTS}):
            try:
                compute_advantages(batch, **options)
            except ConfigError as exc:
                refusals.append(str(exc))
        results["refusals"] = np.array(refusals)

        # rank 1's shard has a NaN reward on an OK row: both ranks raise, neither hangs
        rollouts = shard(rank)
        if rank == 1:
            ok = next(i for i, r in enumerate(rollouts) if r.ok)
            rollouts[ok] = attrs.evolve(rollouts[ok], reward=math.nan)
        try:
            compute_advantages(
                collate(rollouts, pad_token_id=0), scale="batch", gather=all_gather_array
            )
            results["bad_data"] = np.array(["no error"])
        except DataError as exc:
            results["bad_data"] = np.array([str(exc)])

        # rank 1 has no OK rollout at all: it still takes part
        empty = [
            scored_rollout("none", 0.0, repeat_index=i, status=RolloutStatus.EMPTY) for i in (0, 1)
        ]
        mine = shard(0) if rank == 0 else empty
        results["no_ok_rollout"] = compute_advantages(
            collate(mine, pad_token_id=0), scale="batch", gather=all_gather_array
        ).values
        np.savez(Path(out) / f"rank{rank}.npz", **results)
    finally:
        dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    out = tmp_path_factory.mktemp("ranks")
    torch.multiprocessing.spawn(worker, args=(2, free_port(), str(out)), nprocs=2, join=True)
    return [dict(np.load(out / f"rank{rank}.npz")) for rank in range(2)]


@pytest.mark.parametrize("case", sorted(CASES))
def test_convention_batch_statistics_are_global(ranks: list[dict[str, Any]], case: str) -> None:
    """Two ranks with the hook give, bit for bit, one process on the concatenated batch;
    each shard's own batch statistics would not."""
    whole = compute_advantages(collate(shard(0) + shard(1), pad_token_id=0), **CASES[case])
    sharded = np.concatenate([ranks[0][case], ranks[1][case]])
    assert np.array_equal(sharded, whole.values)
    alone = np.concatenate(
        [
            compute_advantages(collate(shard(r), pad_token_id=0), **CASES[case]).values
            for r in (0, 1)
        ]
    )
    assert not np.allclose(alone, whole.values)


def test_array_level_and_group_statistics(ranks: list[dict[str, Any]]) -> None:
    """group_advantages takes the same hook; group scaling needs none and is per group."""
    batch = collate(shard(0) + shard(1), pad_token_id=0)
    whole = group_advantages(batch.rewards, batch.row_ids, batch.ok, scale="batch")
    assert np.array_equal(np.concatenate([ranks[0]["array_level"], ranks[1]["array_level"]]), whole)
    grouped = compute_advantages(batch).values
    got = np.concatenate([ranks[0]["group_without_hook"], ranks[1]["group_without_hook"]])
    assert np.array_equal(got, grouped)


def test_batch_statistics_without_a_hook_are_refused(ranks: list[dict[str, Any]]) -> None:
    """Under a live process group of 2 ranks, scale='batch' and GDPO's batch norm without
    ``gather`` are ConfigErrors that name the hook."""
    for result in ranks:
        refusals = result["refusals"].tolist()
        assert len(refusals) == 2
        assert "scale='batch'" in refusals[0] and "gdpo_batch_norm" in refusals[1]
        assert all("2 ranks" in r and "all_gather_array" in r for r in refusals)


def test_a_failing_rank_leaves_no_rank_waiting(ranks: list[dict[str, Any]]) -> None:
    """Rank 1's NaN reward: rank 1 raises its own DataError, rank 0 learns that another rank
    failed; a rank without any OK rollout still takes part in the gather."""
    assert "is not finite" in str(ranks[1]["bad_data"][0])
    assert "another rank" in str(ranks[0]["bad_data"][0])
    empty = [
        scored_rollout("none", 0.0, repeat_index=i, status=RolloutStatus.EMPTY) for i in (0, 1)
    ]
    whole = compute_advantages(collate(shard(0) + empty, pad_token_id=0), scale="batch").values
    got = np.concatenate([ranks[0]["no_ok_rollout"], ranks[1]["no_ok_rollout"]])
    assert np.array_equal(got, whole)
