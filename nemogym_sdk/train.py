"""nemogym-train: GRPO on NeMo Gym environments, a readable recipe built only from SDK parts.

    python -m nemogym_sdk.train --config run.yaml --steps 40      # flags override the file
    torchrun --nproc_per_node=2 -m nemogym_sdk.train --steps 10    # rollouts sharded by group

A LoRA adapter on a model (the built-in tiny Llama, or a local Hugging Face directory) is
trained on rollouts that NeMo Gym's agents play; the sampler (``nemogym_sdk.serve``, or real
vLLM behind it) serves the adapter by name and gets every new version after each step.
Top to bottom:

    0. config        TrainConfig from the file and the flags (nemogym_sdk.train_config)
    1. processes     one, or several under torchrun (gloo); rank 0 owns the servers
    2. model         the base model + a LoRA adapter (peft), tokenizer, on ``device``
    3. sampler       start the backend (transformers or vLLM), or attach to one
    4. environments  start NeMo Gym (GymStack), or attach through a head server
    5. checks        served name = adapter name, prompt + completion fit max_model_len
    6. loop          rollouts -> parse/collate -> advantages -> train_step -> LoRA sync
    7. outputs       metrics.jsonl, checkpoints (and --resume), summary.json, reward_curve.png

Everything lands in ``out``: ``metrics.jsonl`` (a line per step: rewards, failures by status,
turns, policy vs environment tokens, sampler-vs-learner logprob mismatch, seconds per phase),
``checkpoints/step_NNNNNN/``, ``summary.json``, ``reward_curve.png`` and ``logs/``.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import json
import os
import sys
import time
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import requests

from nemogym_sdk import (
    AgentClient,
    SamplingParams,
    ServerDirectory,
    TaskRow,
    Timeouts,
    check_served_name,
    collate,
    compute_advantages,
    load_rows,
)
from nemogym_sdk.errors import ConfigError
from nemogym_sdk.lora import LoraSync
from nemogym_sdk.train_config import TrainConfig, parse_config, resolve_device
from nemogym_sdk.wire import RESPONSES_CREATE_PARAMS, input_messages

__all__ = ["main", "run"]


# --- 1. processes -------------------------------------------------------------------------


def setup_processes() -> tuple[int, int]:
    """(rank, world size); a gloo process group when torchrun started several."""
    import torch.distributed as dist

    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        dist.init_process_group("gloo")
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def share(value: Any, world: int) -> Any:
    """Rank 0's ``value`` on every rank."""
    if world == 1:
        return value
    import torch.distributed as dist

    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def gather(value: Any, world: int) -> list[Any]:
    """Every rank's ``value``, in rank order, on every rank."""
    if world == 1:
        return [value]
    import torch.distributed as dist

    values: list[Any] = [None] * world
    dist.all_gather_object(values, value)
    return values


# --- 2. model -----------------------------------------------------------------------------


def build_policy(config: TrainConfig, device: str = "cpu") -> tuple[Any, Any]:
    """(the base model with a fresh LoRA adapter, on ``device``, its tokenizer); the same
    weights on every rank (fp32, built or loaded on the CPU, then moved)."""
    import torch
    from peft import LoraConfig, get_peft_model

    base: Any
    tokenizer: Any
    if config.model == "tiny":
        from nemogym_sdk.serve.tiny import build_tiny_model, build_tiny_tokenizer

        base, tokenizer = build_tiny_model(config.seed), build_tiny_tokenizer()
    else:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        base = AutoModelForCausalLM.from_pretrained(config.model, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(config.model)
    torch.manual_seed(config.seed)  # peft draws LoRA's A from the global RNG: same on all ranks
    lora = LoraConfig(
        r=config.lora_rank,
        lora_alpha=2 * config.lora_rank,
        target_modules="all-linear",
        lora_dropout=0.0,  # dropout would make the learner's logprobs differ from the sampler's
    )
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", ".*is_gradient_checkpointing", FutureWarning)
        return get_peft_model(base.to(device), lora), tokenizer


# --- 3. sampler ---------------------------------------------------------------------------


@contextlib.contextmanager
def sampler(config: TrainConfig, out: Path, device: str = "cpu") -> Iterator[str]:
    """The sampler's base URL (``.../v1``): started for this run (the ``transformers`` one on
    ``device``, the learner's), or the one to attach to."""
    logs = out / "logs"
    if config.backend_url is not None:
        url = config.backend_url.rstrip("/")
        url = url if url.endswith("/v1") else url + "/v1"
        try:
            requests.get(f"{url}/models", timeout=10).raise_for_status()
        except requests.RequestException as exc:
            raise ConfigError(
                f"backend_url {url} is not reachable ({exc}); start the sampler first, or drop "
                "backend_url to let nemogym-train start one"
            ) from None
        yield url
        return
    from nemogym_sdk.gym import start_serve

    model = None if config.model == "tiny" else config.model
    if config.backend == "transformers":
        with start_serve(
            mode="sample",
            logprobs_mode="processed_logprobs",  # the distribution sampled from: what GRPO needs
            model=model,
            seed=config.seed,
            extra_args=["--device", device],
            log_path=logs / "serve.log",
        ) as served:
            yield served.base_url
        return
    yield from _vllm_sampler(config, out, model, device)


def _vllm_sampler(config: TrainConfig, out: Path, model: str | None, device: str) -> Iterator[str]:
    """Real vLLM, with ``nemogym_sdk.serve`` in front splicing token-exact multi-turn prompts."""
    from nemogym_sdk.gym import start_serve, start_vllm
    from nemogym_sdk.serve.tiny import save_tiny

    model_dir = Path(model) if model is not None else save_tiny(out / "model", config.seed)
    logs = out / "logs"
    with (
        start_vllm(
            model_dir,
            max_model_len=config.max_model_len,
            max_lora_rank=next(r for r in (8, 16, 32, 64, 128, 256, 512) if r >= config.lora_rank),
            seed=config.seed,
            extra_args=[
                *("--logprobs-mode", "processed_logprobs"),
                # vLLM wants 90 % of a GPU free at start by default; the learner is on it too
                *(("--gpu-memory-utilization", "0.5") if device.startswith("cuda") else ()),
            ],
            log_path=logs / "vllm.log",
        ) as vllm,
        start_serve(
            mode="sample",
            logprobs_mode="processed_logprobs",
            model=str(model_dir),
            extra_args=["--backend", "vllm", "--vllm-url", vllm.base_url],
            log_path=logs / "serve.log",
        ) as proxy,
    ):
        yield proxy.base_url


# --- 4. environments ----------------------------------------------------------------------


@contextlib.contextmanager
def environments(config: TrainConfig, base_url: str, out: Path) -> Iterator[dict[str, Any]]:
    """What the workers need: agent URLs and the training file; checks the served name."""
    if config.head_url is not None:
        directory = ServerDirectory.from_head(config.head_url, wait=60)
        check_served_name(directory, config.adapter_name, backend_url=base_url)
        if config.train_file is None:
            raise ConfigError("attaching through head_url needs train_file (NeMo Gym JSONL rows)")
        yield {"agents": directory.agents, "train_file": config.train_file}
        return
    from nemogym_sdk.gym import GymStack, PolicyModel

    policy = PolicyModel(base_url=base_url, model=config.adapter_name)  # requests the adapter
    with GymStack(config.environments, policy, workdir=out / "gym") as stack:
        check_served_name(stack, config.adapter_name, backend_url=base_url)
        first = config.environments[0]
        train = config.train_file or stack.train_paths.get(first) or stack.example_paths[first]
        yield {"agents": stack.agent_urls, "train_file": str(train)}


# --- 5. checks ----------------------------------------------------------------------------


def check_lengths(rows: Sequence[TaskRow], tokenizer: Any, config: TrainConfig) -> None:
    """Every row's prompt plus its completion budget must fit the sampler's context."""
    for row in rows:
        prompt = tokenizer.apply_chat_template(
            input_messages(row.data), add_generation_prompt=True, tokenize=True
        )
        prompt_len = len(prompt["input_ids"] if hasattr(prompt, "keys") else prompt)
        per_call = row.data[RESPONSES_CREATE_PARAMS].get("max_output_tokens") or 0
        budget = config.max_completion_length or per_call
        if prompt_len + budget > config.max_model_len:
            raise ConfigError(
                f"row {row.row_id}: a {prompt_len}-token prompt plus {budget} completion tokens "
                f"exceeds max_model_len={config.max_model_len}; raise max_model_len (the "
                "sampler's context) or lower max_completion_length / the rows' max_output_tokens"
            )


# --- 6. the loop --------------------------------------------------------------------------


def rows_for_step(rows: Sequence[TaskRow], step: int, config: TrainConfig) -> list[TaskRow]:
    start = (step * config.rows_per_step) % len(rows)
    return [rows[(start + i) % len(rows)] for i in range(config.rows_per_step)]


def step_metrics(batch: Any, rollouts: Sequence[Any], world: int) -> dict[str, Any]:
    """Rewards, failures by status, turns and tokens, over every rank's rollouts."""
    mine = {
        "rewards": [float(r) for r, ok in zip(batch.rewards, batch.ok, strict=True) if ok],
        "turns": [int(t) for t, ok in zip(batch.num_turns, batch.ok, strict=True) if ok],
        "statuses": collections.Counter(str(r.status) for r in rollouts),
        "policy_tokens": int((batch.completion_mask * batch.env_mask).sum()),
        "env_tokens": int((batch.completion_mask * (1 - batch.env_mask)).sum()),
    }
    parts = gather(mine, world)
    rewards = [r for p in parts for r in p["rewards"]]
    turns = [t for p in parts for t in p["turns"]]
    statuses: collections.Counter[str] = sum((p["statuses"] for p in parts), collections.Counter())
    mean = sum(rewards) / len(rewards) if rewards else float("nan")
    std = (sum((r - mean) ** 2 for r in rewards) / len(rewards)) ** 0.5 if rewards else 0.0
    return {
        "reward_mean": mean,
        "reward_std": std,
        "rollouts": sum(statuses.values()),
        "failures": {k: v for k, v in statuses.items() if k != "ok"},
        "turns_mean": sum(turns) / len(turns) if turns else 0.0,
        "policy_tokens": sum(p["policy_tokens"] for p in parts),
        "env_tokens": sum(p["env_tokens"] for p in parts),
    }


def publish(sync: LoraSync | None, model: Any, world: int) -> dict[str, Any]:
    """Rank 0 publishes the adapter; every rank learns the outcome (and fails together)."""
    outcome: dict[str, Any] = {}
    if sync is not None:
        try:
            record = sync.sync(model)
            outcome = {"adapter_version": record.version}
        except Exception as exc:  # noqa: BLE001 - told to every rank, none waits forever
            outcome = {"error": f"{type(exc).__name__}: {exc}"}
    outcome = share(outcome, world)
    if "error" in outcome:
        raise RuntimeError(f"adapter sync failed on rank 0: {outcome['error']}")
    return outcome


def run(config: TrainConfig) -> dict[str, Any]:
    """Train; returns the summary (also written to ``out/summary.json``)."""
    import torch

    from nemogym_sdk.adapters.torch import PolicyLoss, train_step

    rank, world = setup_processes()
    if config.rows_per_step % world:
        raise ConfigError(f"rows_per_step={config.rows_per_step} must divide among {world} ranks")
    device = resolve_device(config, int(os.environ.get("LOCAL_RANK", "0")), world)
    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    model, tokenizer = build_policy(config, device)
    eos = int(tokenizer.eos_token_id)
    pad = int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos)
    optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=config.lr)
    loss = PolicyLoss(
        loss_type=config.loss,  # type: ignore[arg-type]  # checked by TrainConfig
        max_completion_length=config.max_completion_length,
    )
    start, curve = load_checkpoint(model, optimizer, out) if config.resume else (0, [])

    with contextlib.ExitStack() as servers:
        sync: LoraSync | None = None
        info: dict[str, Any] = {}
        if rank == 0:
            base_url = servers.enter_context(sampler(config, out, device))
            info = servers.enter_context(environments(config, base_url, out))
            sync = servers.enter_context(LoraSync(base_url, config.adapter_name, out / "adapters"))
            sync.initialize(model, require_zero=not config.resume)  # before the first rollout
        info = share(info, world)
        rows = load_rows(info["train_file"], seed=config.seed)
        check_lengths(rows, tokenizer, config)
        sampling = SamplingParams(temperature=config.temperature)
        client = servers.enter_context(
            AgentClient(info["agents"], sampling=sampling, timeouts=Timeouts(request=600.0))
        )
        pool = servers.enter_context(concurrent.futures.ThreadPoolExecutor(1))

        def play(step: int) -> Any:
            return client.run_raw_sync(
                rows_for_step(rows, step, config)[rank::world],
                num_generations=config.num_generations,
            )

        bar = progress(config, start, rank)
        metrics_file = open_metrics(out / "metrics.jsonl", start) if rank == 0 else None
        pending = pool.submit(play, start) if config.prefetch else None
        for step in range(start, config.steps):
            began = time.perf_counter()
            # 6.1 rollouts: this rank's whole groups (with prefetch: started during the last step)
            if pending is not None:
                raws = pending.result()
                pending = pool.submit(play, step + 1) if step + 1 < config.steps else None
            else:
                raws = play(step)
            rolled = time.perf_counter()
            # 6.2 parse/collate and group advantages (failures leave the baseline)
            limit = config.max_completion_length
            rollouts = [client.to_rollout(r, eos, max_completion_length=limit) for r in raws]
            batch = collate(rollouts, pad_token_id=pad)
            advantages = compute_advantages(batch)
            parsed = time.perf_counter()
            # 6.3 learner: one optimizer step, gradients summed over ranks
            result = train_step(
                model,
                optimizer,
                batch,
                advantages,
                loss=loss,
                micro_batch_size=config.micro_batch_size,
                temperature=config.temperature,
            )
            learned = time.perf_counter()
            # 6.4 the new adapter to the sampler (rank 0), before the next rollouts
            synced_info = publish(sync, model, world)
            synced = time.perf_counter()
            line = {
                "step": step,
                "device": device,
                **step_metrics(batch, rollouts, world),
                **synced_info,
                "mismatch_max": max(gather(result.mismatch_max, world)),
                "mismatch_mean": sum(gather(result.mismatch_mean, world)) / world,
                "loss": result.loss,
                "grad_norm": result.grad_norm,
                "rollout_s": rolled - began,
                "parse_collate_s": parsed - rolled,
                "learner_s": learned - parsed,
                "sync_s": synced - learned,
                "step_s": synced - began,
            }
            curve.append(line["reward_mean"])
            if metrics_file is not None:
                metrics_file.write(json.dumps(line) + "\n")
                metrics_file.flush()
            bar.update(1)
            bar.set_postfix(
                reward=f"{line['reward_mean']:.3f}", fail=sum(line["failures"].values())
            )
            if rank == 0 and (
                (step + 1) % config.checkpoint_every == 0 or step + 1 == config.steps
            ):
                save_checkpoint(model, optimizer, out, step + 1, curve)
        bar.close()
        if metrics_file is not None:
            metrics_file.close()
    if world > 1:
        import torch.distributed as dist

        dist.destroy_process_group()
    return finish(config, out, curve, rank)


# --- 7. outputs ---------------------------------------------------------------------------


def progress(config: TrainConfig, start: int, rank: int) -> Any:
    from tqdm import tqdm  # type: ignore[import-untyped]

    return tqdm(
        total=config.steps, initial=start, desc="nemogym-train", unit="step", disable=rank != 0
    )


def open_metrics(path: Path, start: int) -> Any:
    """``metrics.jsonl`` for appending, without lines of steps from ``start`` on (a resumed
    run repeats the steps after its checkpoint)."""
    if start and path.exists():
        kept = [line for line in path.read_text().splitlines() if json.loads(line)["step"] < start]
        path.write_text("".join(line + "\n" for line in kept))
    return path.open("a")


def save_checkpoint(model: Any, optimizer: Any, out: Path, step: int, curve: list[float]) -> Path:
    """``out/checkpoints/step_NNNNNN``: the adapter, the optimizer state and the curve so far."""
    import torch

    path = out / "checkpoints" / f"step_{step:06d}"
    model.save_pretrained(path)
    torch.save(optimizer.state_dict(), path / "optimizer.pt")
    (path / "state.json").write_text(json.dumps({"step": step, "curve": curve}))
    return path


def load_checkpoint(model: Any, optimizer: Any, out: Path) -> tuple[int, list[float]]:
    """Load the newest checkpoint in ``out``; (the step to continue from, the curve so far)."""
    import torch
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    found = sorted((out / "checkpoints").glob("step_*"))
    if not found:
        raise ConfigError(f"resume: no checkpoint in {out / 'checkpoints'}; run without --resume")
    path = found[-1]
    set_peft_model_state_dict(model, load_file(str(path / "adapter_model.safetensors")))
    # map_location: a checkpoint written on a GPU resumes on a CPU too (load_state_dict moves
    # the state to the parameters' device)
    state_dict = torch.load(path / "optimizer.pt", map_location="cpu", weights_only=True)
    optimizer.load_state_dict(state_dict)
    state = json.loads((path / "state.json").read_text())
    return int(state["step"]), [float(v) for v in state["curve"]]


def finish(config: TrainConfig, out: Path, curve: list[float], rank: int) -> dict[str, Any]:
    """``summary.json`` and ``reward_curve.png`` (rank 0); print where everything is."""
    head, tail = curve[: min(5, len(curve))], curve[-min(5, len(curve)) :]
    summary: dict[str, Any] = {
        "steps": len(curve),
        "curve": curve,
        "first5": sum(head) / len(head) if head else None,
        "last5": sum(tail) / len(tail) if tail else None,
    }
    if rank == 0:  # rank 0 wrote the checkpoints; the other ranks may be ahead of it here
        checkpoints = sorted((out / "checkpoints").glob("step_*"))
        summary["metrics"] = str(out / "metrics.jsonl")
        summary["checkpoint"] = str(checkpoints[-1]) if checkpoints else None
        summary["reward_curve"] = str(out / "reward_curve.png")
        plot_curve(curve, out / "reward_curve.png", title=", ".join(config.environments))
        (out / "summary.json").write_text(json.dumps(summary, indent=1))
        print(
            f"\nreward {summary['first5']:.3f} (first 5 steps) -> {summary['last5']:.3f} "
            f"(last 5)\nmetrics     {summary['metrics']}\ncheckpoint  {summary['checkpoint']}"
            f"\ncurve       {summary['reward_curve']}",
            flush=True,
        )
    return summary


def plot_curve(curve: Sequence[float], path: Path, *, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(6, 3.5), dpi=100)
    axes.plot(range(1, len(curve) + 1), curve, marker="o", markersize=3)
    axes.set(xlabel="step", ylabel="mean reward (OK rollouts)", title=f"nemogym-train: {title}")
    axes.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)


def main(argv: Sequence[str] | None = None) -> int:
    try:
        run(parse_config(argv))
    except ConfigError as exc:  # what is wrong and how to fix it; no traceback needed
        print(f"nemogym-train: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
