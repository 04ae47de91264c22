"""GRPO with TRL's own ``GRPOTrainer`` on a real NeMo Gym environment, through nemogym_sdk.

TRL trains a LoRA adapter on a tiny random causal LM; NeMo Gym's servers run the SDK's toy
environment ``target_chars`` (three rounds: reply with lowercase letters) and sample through
``nemogym_sdk.serve``, which serves the adapter by its name. The lines a TRL user adds are
marked ``# nemogym_sdk``:

    1. make_dataset(rows)               prompts that carry their row's id
    2. make_rollout_func(deployment)    NeMo Gym agents play each prompt's row (/run)
    3. nemo_gym_reward                  the environment's reward; None for failed rollouts
    4. LoraSyncCallback(LoraSync(...))  the adapter reaches the sampler after every step

Run it (CPU is fine; needs the NeMo Gym venv, ``make gym-venv``)::

    python examples/trl_grpo.py --steps 10 --out runs/trl_grpo

``--out`` receives ``summary.json`` (per step: TRL's logged metrics, the served adapter
version and the rollouts' statuses), TRL's checkpoints directory, the adapters and the logs.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import warnings
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

# rollout_func is marked experimental in TRL; this example knows, and says so once here.
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

import torch
from peft import LoraConfig
from transformers import TrainerCallback
from trl import GRPOConfig, GRPOTrainer

from nemogym_sdk import ServerDirectory, TaskRow, Timeouts, load_rows
from nemogym_sdk.adapters.trl import (
    LoraSyncCallback,
    NemoGymRolloutFunc,
    make_dataset,
    make_rollout_func,
    nemo_gym_reward,
)
from nemogym_sdk.gym import GymStack, start_serve
from nemogym_sdk.lora import LoraSync
from nemogym_sdk.serve.tiny import build_tiny_model, build_tiny_tokenizer

LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


# --- 0. configuration ---------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--rows-per-step", type=int, default=2, help="groups per step")
    parser.add_argument("--num-generations", type=int, default=4, help="rollouts per group")
    parser.add_argument("--lr", type=float, default=2e-2)
    parser.add_argument("--lora-rank", type=int, default=8)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--environment", default="target_chars")
    parser.add_argument("--train-file", type=Path, help="NeMo Gym JSONL (default: the env's)")
    parser.add_argument("--adapter-name", default="policy")
    parser.add_argument("--out", type=Path, default=Path("runs/trl_grpo"))
    parser.add_argument(
        "--report-to",
        default="none",
        help="TRL's report_to (comma-separated, e.g. tensorboard,wandb): the nemo_gym/* "
        "rollout metrics go there with TRL's own",
    )
    return parser.parse_args(argv)


# --- 1. the sampler and the environment ----------------------------------------------------


@contextlib.contextmanager
def servers(args: argparse.Namespace) -> Iterator[dict[str, Any]]:
    """``nemogym_sdk.serve`` (the sampler) and NeMo Gym's servers with a head server."""
    logs = args.out / "logs"
    with start_serve(
        mode="sample",
        logprobs_mode="processed_logprobs",
        seed=args.seed,
        log_path=logs / "serve.log",
    ) as backend:
        # NeMo Gym's model server requests the adapter's name: rollouts sample the adapter.
        policy = backend.policy_model(args.adapter_name)
        with GymStack(
            [args.environment], policy, head_server=True, workdir=args.out / "gym"
        ) as stack:
            assert stack.directory.head_url is not None
            yield {
                "sampler_url": backend.base_url,
                "head_url": stack.directory.head_url,
                "train_path": args.train_file or stack.train_paths[args.environment],
            }


# --- 2. the trainer: TRL's GRPOTrainer plus the four nemogym_sdk pieces ---------------------


def build_trainer(
    args: argparse.Namespace, env: dict[str, Any]
) -> tuple[GRPOTrainer, NemoGymRolloutFunc, LoraSyncCallback]:
    torch.manual_seed(args.seed)
    deployment = ServerDirectory.from_head(env["head_url"])  # discovery, as for a remote one
    rows: list[TaskRow] = load_rows(env["train_path"], seed=args.seed)
    config = GRPOConfig(
        output_dir=str(args.out / "trainer"),
        max_steps=args.steps,
        learning_rate=args.lr,
        per_device_train_batch_size=args.rows_per_step * args.num_generations,
        num_generations=args.num_generations,
        temperature=args.temperature,  # the sampler samples at this temperature too
        max_completion_length=256,
        loss_type="dapo",
        beta=0.0,
        logging_steps=1,
        save_strategy="no",
        report_to=args.report_to.split(","),
        use_cpu=True,
        seed=args.seed,
        dataloader_num_workers=0,
    )
    rollout_func = make_rollout_func(  # nemogym_sdk: 2
        deployment, rows, timeouts=Timeouts(request=300.0)
    )
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", ".*is_gradient_checkpointing", FutureWarning)
        trainer = GRPOTrainer(
            model=build_tiny_model(args.seed),
            processing_class=build_tiny_tokenizer(),
            args=config,
            train_dataset=make_dataset(rows),  # nemogym_sdk: 1
            reward_funcs=[nemo_gym_reward],  # nemogym_sdk: 3
            rollout_func=rollout_func,
            peft_config=LoraConfig(
                r=args.lora_rank,
                lora_alpha=2 * args.lora_rank,
                target_modules=LORA_TARGETS,
                lora_dropout=0.0,
            ),
        )
    sync = LoraSync(env["sampler_url"], args.adapter_name, args.out / "adapters")
    callback = LoraSyncCallback(sync, deployment=deployment)  # nemogym_sdk: 4
    trainer.add_callback(callback)
    return trainer, rollout_func, callback


# --- 3. what each step did ----------------------------------------------------------------


class StepRecorder(TrainerCallback):
    """After each step: the served adapter version and the statuses of the step's rollouts."""

    def __init__(self, rollout_func: NemoGymRolloutFunc, sync: LoraSync) -> None:
        self.rollout_func = rollout_func
        self.sync = sync
        self.steps: list[dict[str, Any]] = []
        self.rollouts: list[tuple[Any, ...]] = []

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        rollouts = self.rollout_func.last_rollouts  # drawn at this step's start
        self.rollouts.append(rollouts)
        self.steps.append(
            {
                "step": state.global_step,
                "served_version": self.sync.served_version(),
                "statuses": dict(Counter(str(r.status) for r in rollouts)),
                "rows": len({r.row_id for r in rollouts}),
                "ok_reward_mean": _mean([r.reward for r in rollouts if r.ok]),
            }
        )


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    with servers(args) as env:
        trainer, rollout_func, callback = build_trainer(args, env)
        assert callback.sync is not None
        recorder = StepRecorder(rollout_func, callback.sync)
        trainer.add_callback(recorder)  # after the sync callback: sees the new version
        with rollout_func:
            trainer.train()
    logged = [entry for entry in trainer.state.log_history if "loss" in entry]
    summary = {
        "steps": [{**step, **log} for step, log in zip(recorder.steps, logged, strict=False)],
        "global_step": trainer.state.global_step,
        "sync_versions": [record.version for record in callback.records],
    }
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1))
    for step in summary["steps"]:
        print(
            f"step {step['step']:3d}  reward {step.get('reward', float('nan')):.3f}  "
            f"statuses {step['statuses']}  adapter v{step['served_version']}",
            flush=True,
        )
    return summary


if __name__ == "__main__":
    main()
