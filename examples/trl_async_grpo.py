"""Asynchronous GRPO with TRL's own ``AsyncGRPOTrainer`` on a real NeMo Gym environment.

TRL trains a LoRA adapter on a tiny random causal LM while NeMo Gym's agents play the next
groups: the SDK's toy environment ``target_chars``, sampled through ``nemogym_sdk.serve``,
which keeps the adapter versions in flight side by side. The lines a TRL user adds are
marked ``# nemogym_sdk``:

    1. NemoGymFeed(client, rows, EngineOptions(...), sync=LoraSync(...))
       whole groups from a RolloutEngine, each episode with the version that sampled it
    2. AsyncGRPOTrainer(..., rollout_worker=feed, weight_transfer=feed); feed.attach(trainer)
       one weight sync per engine step; every sync publishes the adapter
    3. run_async_grpo_on_cpu()          only without a GPU (TRL needs CUDA otherwise)

Run it (CPU is fine; needs the NeMo Gym venv, ``make gym-venv``)::

    python examples/trl_async_grpo.py --steps 4 --out runs/trl_async_grpo

It starts the sampler and NeMo Gym itself, or attaches to running ones (``--head-url``,
``--sampler-url``, ``--train-file``: a sampler that keeps ``max_staleness + 2`` adapter
versions). Attached, it runs on several processes too, every one attaching::

    accelerate launch examples/trl_async_grpo.py --head-url H --sampler-url S --train-file F

``--out`` receives ``summary.json`` (per step: TRL's logged metrics, among them the feed's
``nemogym/*``; the adapter versions published; the groups left untrained), the adapters and
the logs.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # AsyncGRPOTrainer is experimental

import torch
from peft import LoraConfig
from trl.experimental.async_grpo import AsyncGRPOConfig, AsyncGRPOTrainer

from nemogym_sdk import AgentClient, ServerDirectory, load_rows
from nemogym_sdk.adapters.trl import (
    NemoGymFeed,
    make_dataset,
    run_async_grpo_on_cpu,
    sampling_from_args,
)
from nemogym_sdk.gym import GymStack, start_serve
from nemogym_sdk.lora import LoraSync
from nemogym_sdk.rollout_engine import EngineOptions
from nemogym_sdk.serve.tiny import build_tiny_tokenizer, save_tiny


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--groups-per-step", type=int, default=2)
    parser.add_argument("--num-generations", type=int, default=4, help="rollouts per group")
    parser.add_argument("--max-staleness", type=int, default=1, help="K: versions behind")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--adapter-name", default="policy")
    parser.add_argument("--out", type=Path, default=Path("runs/trl_async_grpo"))
    parser.add_argument("--head-url", help="NeMo Gym's head server, to attach to")
    parser.add_argument("--sampler-url", help="the sampler NeMo Gym's model server uses")
    parser.add_argument("--train-file", type=Path, help="NeMo Gym JSONL of training rows")
    return parser.parse_args(argv)


@contextlib.contextmanager
def servers(args: argparse.Namespace) -> Iterator[dict[str, Any]]:
    """``nemogym_sdk.serve`` (the sampler: K + 2 adapter versions side by side, each turn's
    version reported) and NeMo Gym's servers for ``target_chars`` with a head server; or
    the ones given on the command line."""
    if args.head_url is not None:
        if args.sampler_url is None or args.train_file is None:
            raise SystemExit("--head-url needs --sampler-url and --train-file")
        yield {
            "sampler_url": args.sampler_url,
            "head_url": args.head_url,
            "train_path": args.train_file,
        }
        return
    versions = ["--adapter-versions", str(args.max_staleness + 2), "--version-policy", "pinned"]
    with start_serve(
        mode="sample",
        logprobs_mode="processed_logprobs",
        seed=args.seed,
        extra_args=["--device", "cpu", *versions],
        log_path=args.out / "logs" / "serve.log",
    ) as backend:
        policy = backend.policy_model(args.adapter_name)  # rollouts sample the adapter
        with GymStack(
            ["target_chars"], policy, head_server=True, workdir=args.out / "gym"
        ) as stack:
            assert stack.directory.head_url is not None
            yield {
                "sampler_url": backend.base_url,
                "head_url": stack.directory.head_url,
                "train_path": stack.train_paths["target_chars"],
            }


def build_trainer(
    args: argparse.Namespace, env: dict[str, Any]
) -> tuple[AsyncGRPOTrainer, NemoGymFeed, AgentClient, LoraSync]:
    gpu = torch.cuda.is_available()
    if not gpu:
        run_async_grpo_on_cpu()  # nemogym_sdk: 3
    per_step = args.groups_per_step * args.num_generations
    config = AsyncGRPOConfig(
        output_dir=str(args.out / "trainer"),
        max_steps=args.steps,
        learning_rate=args.lr,
        num_generations=args.num_generations,
        per_device_train_batch_size=args.num_generations,  # a group per micro-batch
        gradient_accumulation_steps=per_step // args.num_generations,  # a step per sync
        token_budget=0,  # batches by count: one weight sync consumes one engine step
        max_staleness=args.max_staleness,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        seed=args.seed,
        **({} if gpu else {"use_cpu": True, "bf16": False, "dtype": "float32"}),
    )
    deployment = ServerDirectory.from_head(env["head_url"])  # discovery, as for a remote one
    rows = load_rows(env["train_path"], seed=args.seed)
    tokenizer = build_tiny_tokenizer()
    client = AgentClient(deployment, sampling=sampling_from_args(config))
    sync = LoraSync(env["sampler_url"], args.adapter_name, args.out / "adapters")
    feed = NemoGymFeed(  # nemogym_sdk: 1
        client,
        rows,
        EngineOptions(
            num_generations=args.num_generations,
            groups_per_step=args.groups_per_step,
            max_staleness=args.max_staleness,
            seed=args.seed,  # seeded rollouts: a group played again draws the same tokens
        ),
        sync=sync,
        eos_token_id=tokenizer.eos_token_id,
    )
    trainer = AsyncGRPOTrainer(
        str(save_tiny(args.out / "model", args.seed)),
        args=config,
        train_dataset=make_dataset(rows),
        processing_class=tokenizer,
        peft_config=LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"]),
        rollout_worker=feed,  # nemogym_sdk: 2
        weight_transfer=feed,
    )
    feed.attach(trainer)  # nemogym_sdk: 2 (on every process)
    return trainer, feed, client, sync


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    with servers(args) as env:
        trainer, feed, client, sync = build_trainer(args, env)
        try:
            trainer.train()
        finally:
            feed.stop()  # feed.leftover: the groups to play first when resuming
            client.close()
            sync.close()
    leftover = feed.leftover
    summary = {
        "steps": [entry for entry in trainer.state.log_history if "loss" in entry],
        "published_versions": [record.version for record in sync.history],
        "untrained_groups": list(leftover.requeue) if leftover is not None else None,
        "next_group": leftover.next_index if leftover is not None else None,
    }
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1))
    for step in summary["steps"]:
        print(
            f"step {step['step']:3d}  reward {step.get('reward', float('nan')):.3f}  "
            f"staleness max {step.get('sample/staleness_max', 0):.0f}  "
            f"ok {step.get('nemogym/ok_frac', float('nan')):.2f}",
            flush=True,
        )
    return summary


if __name__ == "__main__":
    main()
