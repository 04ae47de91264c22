"""TRL's ``AsyncGRPOTrainer`` fed by ``NemoGymFeed`` on every process of a torchrun job (CPU,
gloo): ``python -m torch.distributed.run --nproc_per_node=2 -m tests.gym.trl_async_ranks``.

Run by ``test_trl_async.py::test_two_ranks_share_each_step_and_rank_0_publishes_the_whole_adapter``.
TRL's train begin, loader and weight sync are driven by hand twice, with the policy whole on
every rank and sharded with FSDP2 (torch's ``fully_shard``, what accelerate applies to TRL's
model on GPUs; accelerate does not shard on the CPU); then ``trainer.train()`` runs two
steps data-parallel (``trained``), on the CPU by ``run_async_grpo_on_cpu``. For the first
two, every rank writes what it saw to ``<root>/<mode>/rank<r>.json``:

- the loss terms of its row of each step's micro-batch (TRL's loader deals them out);
- rank 0: the terms of the samples the loader took for each step, their groups and
  versions, the versions served, and how far the published adapter is from the policy's
  whole adapter (snapshotted before sharding, with the same change an optimizer step would
  make applied to it).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch

from nemogym_sdk.directory import ServerDirectory
from tests.gym.trl_async import (
    GENERATIONS,
    GROUPS,
    build,
    sample_terms,
    train,
    trained_terms,
)

NUDGE = 0.5
"""Added to every ``lora_B`` weight on every rank: the change an optimizer step makes."""


def lora_weights(model: Any) -> dict[str, torch.Tensor]:
    """The adapter's weights as the published file names them (no adapter name)."""
    return {
        name.replace(".default", ""): param.detach().clone()
        for name, param in model.named_parameters()
        if "lora_" in name
    }


def published_drift(path: str, expected: dict[str, torch.Tensor]) -> float:
    """The largest difference between the published adapter and ``expected``."""
    from safetensors.torch import load_file

    saved = load_file(str(Path(path) / "adapter_model.safetensors"))
    assert set(saved) == set(expected), (sorted(saved), sorted(expected))
    return max(float((saved[k] - expected[k]).abs().max()) for k in expected)


def one_mode(args: argparse.Namespace, mode: str) -> None:
    from nemogym_sdk.adapters.torch.sharding import is_sharded, shard

    root = args.root / mode
    directory = ServerDirectory.from_head(args.head)
    trainer, feed, client, sync = build(
        directory, args.sampler, args.train_file, root, args.model, processes=2
    )
    main = trainer.accelerator.is_main_process
    model = trainer.accelerator.unwrap_model(trainer.model)
    before = lora_weights(model)
    expected = {k: v + NUDGE if "lora_B" in k else v for k, v in before.items()}
    if mode == "sharded":
        shard(model)
    seen: dict[str, Any] = {"rank": trainer.accelerator.process_index, "sharded": is_sharded(model)}
    try:
        trainer.callback_handler.on_train_begin(trainer.args, trainer.state, trainer.control)
        if main:
            seen["served_cold"] = sync.served_version()
            seen["published_cold"] = published_drift(sync.history[-1].path, before)
        loader = iter(trainer.get_train_dataloader())
        per_step = GROUPS * GENERATIONS
        seen["steps"] = []
        for step in range(2):
            batch = next(loader)  # one micro-batch a step: gradient_accumulation_steps=1
            mine: dict[str, Any] = {"terms": trained_terms(batch)}
            if main:
                taken = feed.rollout_buffer.taken[step * per_step : (step + 1) * per_step]
                mine |= {
                    "taken": len(taken),
                    "want": sample_terms(taken),
                    "groups": sorted({s.group_id for s in taken}),
                    "sizes": sorted(
                        sum(s.group_id == g for s in taken) for g in {s.group_id for s in taken}
                    ),
                    "staleness": [trainer.model_version - s.model_version for s in taken],
                }
            seen["steps"].append(mine)
            if step == 0:  # what an optimizer step changes, then TRL's own weight sync
                with torch.no_grad():
                    for name, param in model.named_parameters():
                        if "lora_B" in name:
                            param.add_(NUDGE)
                trainer.state.global_step = 1  # as the trainer counts it before on_step_end
                trainer.callback_handler.on_step_end(trainer.args, trainer.state, trainer.control)
                if main:
                    seen["served_after_sync"] = sync.served_version()
                    seen["model_version"] = trainer.model_version
                    seen["published"] = published_drift(sync.history[-1].path, expected)
    finally:
        feed.stop()
        client.close()
        sync.close()
    if main:
        assert feed.leftover is not None
        seen["requeue"] = list(feed.leftover.requeue)
        seen["next_index"] = feed.leftover.next_index
    root.mkdir(parents=True, exist_ok=True)
    (root / f"rank{seen['rank']}.json").write_text(json.dumps(seen))
    trainer.accelerator.wait_for_everyone()


def trained(args: argparse.Namespace) -> None:
    """``trainer.train()`` on both ranks, two optimizer steps (data-parallel: accelerate
    wraps the policy in DDP); rank 0 writes TRL's logs and the versions published."""
    root = args.root / "trained"
    directory = ServerDirectory.from_head(args.head)
    trainer, feed, client, sync = build(
        directory, args.sampler, args.train_file, root, args.model, processes=2
    )
    steps = train(trainer, feed, client, sync)
    if trainer.accelerator.is_main_process:
        versions = [record.version for record in sync.history]
        seen = {"steps": steps, "versions": versions, "served": versions[-1]}
        root.mkdir(parents=True, exist_ok=True)
        (root / "rank0.json").write_text(json.dumps(seen))
    trainer.accelerator.wait_for_everyone()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--head", required=True)
    parser.add_argument("--sampler", required=True)
    parser.add_argument("--train-file", type=Path, required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--root", type=Path, required=True)
    parser.add_argument("--modes", nargs="+", default=["whole", "sharded", "trained"])
    args = parser.parse_args()
    from nemogym_sdk.adapters.trl import run_async_grpo_on_cpu

    run_async_grpo_on_cpu()
    for mode in args.modes:
        if mode == "trained":
            trained(args)
        else:
            one_mode(args, mode)


if __name__ == "__main__":
    main()
