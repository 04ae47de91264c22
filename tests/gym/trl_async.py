"""TRL's ``AsyncGRPOTrainer`` fed by ``NemoGymFeed``, as a user builds it: shared by
``test_trl_async.py`` (one process) and ``trl_async_ranks.py`` (two, under torchrun).

TRL's constructor queries the GPU's peak FLOPs (telemetry), and its tree attention calls a
FlashAttention-3 kernel fetched from the Hugging Face Hub: on this machine the caller
replaces both before `build` (``run_async_grpo_on_cpu``; `on_cpu` in a test).
"""

from __future__ import annotations

import queue
from pathlib import Path
from typing import Any

import numpy as np

from nemogym_sdk.client import AgentClient
from nemogym_sdk.data import load_rows
from nemogym_sdk.directory import ServerDirectory
from nemogym_sdk.lora import LoraSync
from nemogym_sdk.rollout_engine import EngineOptions

GENERATIONS, GROUPS = 4, 2
OPTIONS = EngineOptions(
    num_generations=GENERATIONS, groups_per_step=GROUPS, max_staleness=1, seed=0
)
CPU: dict[str, Any] = {"use_cpu": True, "bf16": False, "dtype": "float32"}


class Taken(queue.Queue[Any]):
    """The feed's queue, remembering what the trainer took from it."""

    def __init__(self) -> None:
        super().__init__()
        self.taken: list[Any] = []

    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        item = super().get(block, timeout)
        self.taken.append(item)
        return item


def on_cpu(monkeypatch: Any) -> None:
    """``run_async_grpo_on_cpu`` for one test: TRL's two functions come back after it."""
    from trl.experimental.async_grpo import async_grpo_trainer, packing

    from nemogym_sdk.adapters.trl import run_async_grpo_on_cpu

    for module, name in (
        (async_grpo_trainer, "get_peak_flops_per_device"),
        (packing, "_flash_attn"),
    ):
        monkeypatch.setattr(module, name, getattr(module, name))
    run_async_grpo_on_cpu()


def build(
    directory: ServerDirectory,
    sampler_url: str,
    train_file: Path,
    root: Path,
    model_path: str,
    *,
    processes: int = 1,
) -> tuple[Any, Any, AgentClient, LoraSync]:
    """The trainer and its feed (the lines ``docs/trl.md`` shows), on the CPU, the feed's
    queue a `Taken` on rank 0. Returns (trainer, feed, client, sync)."""
    from peft import LoraConfig
    from trl.experimental.async_grpo import AsyncGRPOConfig, AsyncGRPOTrainer

    from nemogym_sdk.adapters.trl import NemoGymFeed, make_dataset, sampling_from_args
    from nemogym_sdk.serve.tiny import build_tiny_tokenizer

    rows, tokenizer = load_rows(train_file)[:3], build_tiny_tokenizer()
    adapters, cpu = root / "adapters", CPU
    # --8<-- [start:config]
    args = AsyncGRPOConfig(
        output_dir=str(root / "out"),
        max_steps=2,
        num_generations=4,
        per_device_train_batch_size=4,  # x processes x gradient_accumulation_steps:
        gradient_accumulation_steps=2 // processes,  # one engine step (8 samples)
        token_budget=0,  # batches by count
        max_staleness=1,
        report_to=[],
        **cpu,
    )
    options = EngineOptions(num_generations=4, groups_per_step=2, max_staleness=1, seed=0)
    # --8<-- [end:config]
    # --8<-- [start:feed]
    client = AgentClient(directory, sampling=sampling_from_args(args))
    sync = LoraSync(sampler_url, "policy", adapters)
    feed = NemoGymFeed(client, rows, options, sync=sync, eos_token_id=tokenizer.eos_token_id)
    trainer = AsyncGRPOTrainer(
        model_path,
        args=args,
        train_dataset=make_dataset(rows),
        processing_class=tokenizer,
        peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]),
        rollout_worker=feed,
        weight_transfer=feed,
    )
    feed.attach(trainer)  # on every process: checks the cadence, binds the model
    # --8<-- [end:feed]
    assert options == OPTIONS
    if trainer.accelerator.is_main_process:
        feed.rollout_buffer = trainer.rollout_queue = Taken()  # before the loader reads it
    return trainer, feed, client, sync


def trained_terms(batch: dict[str, Any]) -> list[tuple[int, float, float]]:
    """A packed micro-batch's (or one rank's row of it) loss terms: (label, old logprob,
    advantage) per trained token."""
    kept = batch["token_index"] >= 0
    labels = batch["shift_labels"][0][batch["token_index"][kept]].tolist()
    logps = batch["old_log_probs"][kept].tolist()
    advantages = batch["advantages"][kept].tolist()
    return list(zip(labels, logps, advantages, strict=True))


def sample_terms(samples: list[Any]) -> list[tuple[int, float, float]]:
    """What training ``samples`` means: (label, sampler logprob, advantage) per policy token."""
    terms: list[tuple[int, float, float]] = []
    for sample in samples:
        trained = np.flatnonzero(sample.completion_mask)
        terms += zip(
            sample.input_ids[trained].tolist(),
            sample.old_log_probs[trained].tolist(),
            [sample.advantage] * len(trained),
            strict=True,
        )
    return terms


def same_terms(got: list[Any], want: list[Any]) -> None:
    """The same loss terms, in any order."""
    got_sorted, want_sorted = np.array(sorted(map(tuple, got))), np.array(sorted(map(tuple, want)))
    assert got_sorted.shape == want_sorted.shape and got_sorted.shape[0] > 0
    np.testing.assert_allclose(got_sorted, want_sorted, rtol=0, atol=1e-5)


def train(trainer: Any, feed: Any, client: AgentClient, sync: LoraSync) -> list[dict[str, Any]]:
    """``trainer.train()``, then the feed stopped and its connections closed, as a user
    would; TRL's logs of each optimizer step."""
    try:
        trainer.train()
    finally:
        feed.stop()
        client.close()
        sync.close()
    return [entry for entry in trainer.state.log_history if "loss" in entry]
