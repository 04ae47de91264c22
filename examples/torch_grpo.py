"""GRPO on a real NeMo Gym environment, in a hand-written PyTorch loop built from nemogym_sdk.

The policy is a LoRA adapter on a tiny random causal LM; ``nemogym_sdk.serve`` samples it (by the
adapter's name, with processed logprobs); NeMo Gym's servers run the SDK's toy environment
``target_chars`` (three rounds: reply with lowercase letters). Every step:

    1. rollouts       AgentClient plays this rank's rows (whole groups) through NeMo Gym's /run
    2. parse/collate  /run bodies -> Rollout -> Batch, then group advantages (nemogym_sdk.grpo)
    3. learner        adapters.torch.train_step: forward/backward, gradients summed over ranks
    4. sync           rank 0 publishes the new adapter version with LoraSync; all ranks wait

Run it (CPU is fine; needs the NeMo Gym venv, ``make gym-venv``)::

    python examples/torch_grpo.py --steps 20 --out runs/grpo
    torchrun --nproc_per_node=2 examples/torch_grpo.py --steps 3 --out runs/grpo2

``--out`` receives ``metrics.jsonl`` (one line per step), ``summary.json``, each rank's final
weights digest, the adapters and the servers' logs.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import hashlib
import json
import os
import time
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from nemogym_sdk import (
    AgentClient,
    SamplingParams,
    TaskRow,
    Timeouts,
    check_served_name,
    collate,
    compute_advantages,
    load_rows,
)
from nemogym_sdk.adapters.torch import PolicyLoss, train_step
from nemogym_sdk.gym import GymStack, start_serve
from nemogym_sdk.lora import LoraSync
from nemogym_sdk.serve.tiny import build_tiny_model

EOS, PAD = 258, 259  # the tiny tokenizer's <|im_end|> and <|pad|>
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


# --- 0. configuration ---------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rows-per-step", type=int, default=4, help="groups per step")
    parser.add_argument("--num-generations", type=int, default=8, help="rollouts per group")
    parser.add_argument("--lr", type=float, default=2e-2)
    parser.add_argument("--lora-rank", type=int, default=8)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--loss", default="dapo", choices=("grpo", "dapo", "dr_grpo", "gspo"))
    parser.add_argument("--micro-batch-size", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--environment", default="target_chars")
    parser.add_argument("--adapter-name", default="policy")
    parser.add_argument("--out", type=Path, default=Path("runs/torch_grpo"))
    parser.add_argument(
        "--check-gradients",
        action="store_true",
        help="distributed runs: compare step 0's summed gradient with one process's",
    )
    return parser.parse_args(argv)


# --- 1. processes -------------------------------------------------------------------------


def setup_distributed() -> tuple[int, int]:
    """(rank, world size); gloo when launched by torchrun with more than one process."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        dist.init_process_group("gloo")
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def broadcast(value: Any, world: int) -> Any:
    """Rank 0's ``value`` on every rank (pickled)."""
    if world == 1:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def all_sum(values: list[float], world: int) -> list[float]:
    if world == 1:
        return values
    tensor = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(tensor)
    return tensor.tolist()


# --- 2. model -----------------------------------------------------------------------------


def build_policy(args: argparse.Namespace) -> Any:
    """The tiny base model (the sampler builds the same weights from the same seed) + LoRA.

    peft draws LoRA's A matrices from the global RNG: seeding it makes every rank start from
    the same weights. B starts at zero, so version 0 of the adapter equals the base model.
    """
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(args.seed)
    config = LoraConfig(
        r=args.lora_rank,
        lora_alpha=2 * args.lora_rank,
        target_modules=LORA_TARGETS,
        lora_dropout=0.0,  # dropout would make the learner's logprobs differ from the sampler's
    )
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", ".*is_gradient_checkpointing", FutureWarning)
        return get_peft_model(build_tiny_model(args.seed), config)


def weights_digest(model: Any) -> str:
    """SHA-256 over the trainable weights' bytes: equal digests, bitwise-equal weights."""
    digest = hashlib.sha256()
    for name, param in sorted(model.named_parameters()):
        if param.requires_grad:
            digest.update(name.encode())
            digest.update(param.detach().contiguous().numpy().tobytes())
    return digest.hexdigest()


# --- 3. the environment and the sampler (rank 0) ------------------------------------------


@contextlib.contextmanager
def servers(args: argparse.Namespace, model: Any) -> Iterator[dict[str, Any]]:
    """Start the sampler and NeMo Gym, publish adapter version 0; yield what workers need."""
    out = args.out
    with start_serve(
        mode="sample",
        logprobs_mode="processed_logprobs",  # the distribution sampled from (see docs)
        seed=args.seed,
        log_path=out / "logs" / "serve.log",
    ) as backend:
        # NeMo Gym's model server requests the adapter's name: rollouts sample the adapter.
        policy = backend.policy_model(args.adapter_name)
        with GymStack([args.environment], policy, workdir=out / "gym") as stack:
            check_served_name(stack, args.adapter_name, backend_url=backend.base_url)
            with LoraSync(backend.base_url, args.adapter_name, out / "adapters") as sync:
                sync.initialize(model)  # version 0 (zero adapter) before the first rollout
                yield {
                    "agents": stack.agent_urls,
                    "train_path": str(stack.train_paths[args.environment]),
                    "sync": sync,
                }


# --- 4. the loop --------------------------------------------------------------------------


def rows_for_step(rows: list[TaskRow], step: int, per_step: int) -> list[TaskRow]:
    start = (step * per_step) % len(rows)
    return [rows[(start + i) % len(rows)] for i in range(per_step)]


def run(args: argparse.Namespace, rank: int, world: int) -> dict[str, Any]:
    args.out.mkdir(parents=True, exist_ok=True)
    model = build_policy(args)
    initial_digest = weights_digest(model)
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.Adam(trainable, lr=args.lr)
    loss = PolicyLoss(loss_type=args.loss)
    metrics_file = (args.out / "metrics.jsonl").open("w") if rank == 0 else None
    curve: list[float] = []
    gradient_check: dict[str, float] | None = None

    with servers(args, model) if rank == 0 else contextlib.nullcontext({}) as shared:
        info = broadcast({k: v for k, v in shared.items() if k != "sync"}, world)
        sync: LoraSync | None = shared.get("sync")
        rows = load_rows(info["train_path"], seed=args.seed)
        sampling = SamplingParams(temperature=args.temperature)
        timeouts = Timeouts(request=300.0)
        with AgentClient(info["agents"], sampling=sampling, timeouts=timeouts) as client:
            for step in range(args.steps):
                began = time.perf_counter()
                # 1. rollouts: this rank's share of the step's rows, whole groups each
                mine = rows_for_step(rows, step, args.rows_per_step)[rank::world]
                raws = client.run_raw_sync(mine, num_generations=args.num_generations)
                rolled = time.perf_counter()

                # 2. parse and collate; advantages within each (complete) group
                rollouts = [client.to_rollout(raw, EOS) for raw in raws]
                batch = collate(rollouts, pad_token_id=PAD)
                advantages = compute_advantages(batch)
                parsed = time.perf_counter()

                # 3. learner: one optimizer step; gradients are summed over ranks
                reference = None
                if args.check_gradients and step == 0 and world > 1:
                    reference = copy.deepcopy(model)
                result = train_step(
                    model,
                    optimizer,
                    batch,
                    advantages,
                    loss=loss,
                    micro_batch_size=args.micro_batch_size,
                    temperature=args.temperature,
                )
                if reference is not None:
                    gradient_check = check_gradients(model, reference, rollouts, args, world)
                learned = time.perf_counter()

                # 4. sync: rank 0 publishes the new adapter; every rank waits for the outcome
                served = None
                if sync is not None:
                    try:
                        record = sync.sync(model)
                        served = {"version": record.version, "served": sync.served_version()}
                    except Exception as exc:  # noqa: BLE001 - told to every rank, none waits forever
                        served = {"error": f"{type(exc).__name__}: {exc}"}
                served = broadcast(served, world)
                if "error" in served:
                    raise RuntimeError(f"adapter sync failed on rank 0: {served['error']}")
                synced = time.perf_counter()

                # metrics, over every rank's rollouts
                ok = batch.ok
                total, count, oks, n = all_sum(
                    [float(batch.rewards[ok].sum()), float(ok.sum()), float(ok.sum()), len(ok)],
                    world,
                )
                reward = total / count if count else float("nan")
                curve.append(reward)
                record_line = {
                    "step": step,
                    "reward_mean": reward,
                    "ok_fraction": oks / n,
                    "turns_mean": float(batch.num_turns[ok].mean()) if ok.any() else 0.0,
                    "adapter_version": served["version"],
                    "served_version": served["served"],
                    **result.as_dict(),
                    **advantages.stats.as_metrics("adv/"),
                    "rollout_s": rolled - began,
                    "parse_collate_s": parsed - rolled,
                    "learner_s": learned - parsed,
                    "sync_s": synced - learned,
                    "step_s": synced - began,
                }
                if metrics_file is not None:
                    metrics_file.write(json.dumps(record_line) + "\n")
                    metrics_file.flush()
                    print(
                        f"step {step:3d}  reward {reward:.3f}  ok {oks / n:.2f}  "
                        f"mismatch max {result.mismatch_max:.1e}  adapter v{served['served']}  "
                        f"({rolled - began:.1f}s rollouts, {learned - parsed:.2f}s learner, "
                        f"{synced - learned:.2f}s sync)",
                        flush=True,
                    )

    digest = weights_digest(model)
    (args.out / f"final_rank{rank}.json").write_text(
        json.dumps({"weights_sha256": digest, "initial_weights_sha256": initial_digest})
    )
    summary = {
        "steps": args.steps,
        "world_size": world,
        "curve": curve,
        "first5": sum(curve[:5]) / len(curve[:5]) if curve else None,
        "last5": sum(curve[-5:]) / len(curve[-5:]) if curve else None,
        "gradient_check": gradient_check,
    }
    if rank == 0:
        (args.out / "summary.json").write_text(json.dumps(summary, indent=1))
        if metrics_file is not None:
            metrics_file.close()
    return summary


def check_gradients(
    model: Any, reference: Any, rollouts: list[Any], args: argparse.Namespace, world: int
) -> dict[str, float]:
    """Step 0's gradient, summed over ranks, against one process on the whole batch.

    Every rank gathers all ranks' rollouts; the reference copy (the weights before the step)
    takes one train_step alone on the full batch (``distributed=False``, learning rate 0),
    split into other micro-batches, so the sums run in another order.
    """
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, rollouts)
    full = collate([r for part in gathered for r in part], pad_token_id=PAD)
    frozen = torch.optim.SGD([p for p in reference.parameters() if p.requires_grad], lr=0.0)
    train_step(
        reference,
        frozen,
        full,
        compute_advantages(full),
        loss=PolicyLoss(loss_type=args.loss),
        micro_batch_size=max(1, args.micro_batch_size // 3),
        temperature=args.temperature,
        distributed=False,
    )
    mine = dict(model.named_parameters())
    worst_abs = worst_rel = scale = 0.0
    for name, param in reference.named_parameters():
        if param.grad is None:
            continue
        got = mine[name].grad
        assert got is not None, name
        diff = float((got - param.grad).abs().max())
        size = float(param.grad.abs().max())
        worst_abs = max(worst_abs, diff)
        scale = max(scale, size)
        worst_rel = max(worst_rel, diff / size if size else diff)
    return {"max_abs_diff": worst_abs, "max_abs_grad": scale, "max_rel_diff": worst_rel}


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    rank, world = setup_distributed()
    try:
        return run(args, rank, world)
    finally:
        if world > 1:
            dist.destroy_process_group()


if __name__ == "__main__":
    main()
