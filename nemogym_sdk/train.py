"""nemogym-train: GRPO on NeMo Gym environments, a readable recipe built only from SDK parts.

    python -m nemogym_sdk.train --config run.yaml --steps 40      # flags override the file
    torchrun --nproc_per_node=2 -m nemogym_sdk.train --steps 10    # rollouts sharded by group
    python -m nemogym_sdk.train --mode async --max-staleness 1     # rollouts never stop

A LoRA adapter on a model (the built-in tiny Llama, or a local Hugging Face directory) is
trained on rollouts that NeMo Gym's agents play; the sampler (``nemogym_sdk.serve``, or real
vLLM behind it) serves the adapter by name and gets every new version after each step.
Top to bottom:

    0. config        TrainConfig from the file and the flags (nemogym_sdk.train_config)
    1. processes     one, or several under torchrun (gloo); rank 0 owns the servers
    2. model         the base model + a LoRA adapter (peft), tokenizer, on ``device``
    3. sampler       start the backend (transformers or vLLM), or attach to one
    4. environments  start NeMo Gym (GymStack), or attach through a head server
    5. checks        served name = adapter name, prompt + completion fit max_model_len,
                     (async) the sampler keeps max_staleness + 2 adapter versions
    6. loop          rollouts -> collate -> advantages -> train_step -> LoRA sync; the
                     rollouts come synchronously or from the RolloutEngine
                     (nemogym_sdk.train_play)
    7. outputs       metrics.jsonl, checkpoints (and --resume), summary.json, reward_curve.png
                     (nemogym_sdk.train_outputs)

Everything lands in ``out``: ``metrics.jsonl`` (a line per step: the SDK's step metrics,
``nemogym_sdk.metrics.RolloutStats`` and ``adapters.torch.StepMetrics``, over every rank,
plus seconds per phase), ``checkpoints/step_NNNNNN/``, ``summary.json``,
``reward_curve.png`` and ``logs/``.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import attrs
import requests

from nemogym_sdk import (
    AgentClient,
    Rollout,
    SamplingParams,
    ServerDirectory,
    TaskRow,
    Timeouts,
    check_served_name,
    collate,
    compute_advantages,
    load_rows,
    ranks,
)
from nemogym_sdk._http import check, send
from nemogym_sdk.errors import ConfigError, NemoGymError
from nemogym_sdk.hosts import openai_url
from nemogym_sdk.lora import LoraSync
from nemogym_sdk.metrics import RolloutStats
from nemogym_sdk.train_config import TrainConfig, parse_config, resolve_device
from nemogym_sdk.train_outputs import (
    finish,
    load_checkpoint,
    load_state,
    outputs,
    save_checkpoint,
)
from nemogym_sdk.train_play import play
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


@attrs.frozen(kw_only=True)
class Setup:
    """What every step of a run uses besides the model and the optimizer."""

    config: TrainConfig
    """The run's configuration."""
    device: str
    """Where the learner runs (``resolve_device``)."""
    sampling: SamplingParams
    """How the rollouts are sampled: forced onto every row by ``AgentClient`` and used by
    ``train_step`` for the learner's logprobs (one record, so the two cannot differ)."""
    loss: Any
    """The policy loss (``PolicyLoss``)."""
    pad: int
    """The padding token id."""

    @classmethod
    def of(cls, config: TrainConfig, device: str, tokenizer: Any) -> Setup:
        from nemogym_sdk.adapters.torch import PolicyLoss

        eos = int(tokenizer.eos_token_id)
        return cls(
            config=config,
            device=device,
            sampling=SamplingParams(temperature=config.temperature),
            loss=PolicyLoss(
                loss_type=config.loss,
                max_completion_length=config.max_completion_length,
                importance_sampling=config.importance_sampling,
                is_cap=config.is_cap,
                is_floor=config.is_floor,
            ),
            pad=int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos),
        )


def adam(model: Any, config: TrainConfig) -> Any:
    """Adam over the trainable (LoRA) parameters."""
    import torch

    return torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=config.lr)


# --- 3. sampler ---------------------------------------------------------------------------


@contextlib.contextmanager
def sampler(config: TrainConfig, out: Path, device: str = "cpu") -> Iterator[str]:
    """The sampler's base URL (``.../v1``): started for this run (the ``transformers`` one on
    ``device``, the learner's), or the one to attach to."""
    logs = out / "logs"
    if config.backend_url is not None:
        url = openai_url(config.backend_url)
        try:
            with requests.Session() as http:
                check(send(http, "GET", f"{url}/models", timeout=10), f"{url}/models")
        except NemoGymError as exc:
            raise ConfigError(
                f"backend_url {url} is not reachable ({exc}); start the sampler first, or drop "
                "backend_url to let nemogym-train start one"
            ) from None
        yield url
        return
    from nemogym_sdk.gym import start_serve

    model = None if config.model == "tiny" else config.model
    if config.several_samplers:
        yield from _replicated_sampler(config, out, model, device)
        return
    if config.backend == "transformers":
        with start_serve(
            mode="sample",
            logprobs_mode="processed_logprobs",  # the distribution sampled from: what GRPO needs
            model=model,
            seed=config.seed,
            extra_args=["--device", device, *_version_args(config)],
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
            max_loras=max(2, config.adapter_versions),  # every version kept, in one batch
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
            extra_args=["--backend", "vllm", "--vllm-url", vllm.base_url, *_version_args(config)],
            log_path=logs / "serve.log",
        ) as proxy,
    ):
        yield proxy.base_url


def _replicated_sampler(
    config: TrainConfig, out: Path, model: str | None, device: str
) -> Iterator[str]:
    """Several replicas behind ``vllm-router``, ``nemogym_sdk.serve`` in front of it: the
    ones started here (``replicas``), or running ones (``router_url`` + ``replica_urls``)."""
    from nemogym_sdk.gym import start_samplers, start_serve
    from nemogym_sdk.serve.tiny import save_tiny

    model_dir = Path(model) if model is not None else save_tiny(out / "model", config.seed)
    logs = out / "logs"
    if config.router_url is not None:
        args = ["--backend", "vllm", "--vllm-url", openai_url(config.router_url)]
        args += [a for url in config.replica_urls for a in ("--replica", openai_url(url))]
        with start_serve(
            mode="sample",
            logprobs_mode="processed_logprobs",
            model=str(model_dir),
            extra_args=[*args, *_version_args(config)],
            log_path=logs / "serve.log",
        ) as proxy:
            yield proxy.base_url
        return
    on_gpu = device.startswith("cuda")
    replica_args = ["--device", device] if config.backend == "transformers" else []
    if config.backend == "vllm" and on_gpu:
        replica_args = ["--gpu-memory-utilization", str(round(0.5 / config.replicas, 2))]
    with start_samplers(
        config.replicas,
        model_dir,
        backend=config.backend,
        seed=config.seed,
        adapter_versions=config.adapter_versions,
        version_policy=config.version_policy,
        max_model_len=config.max_model_len,
        max_lora_rank=next(r for r in (8, 16, 32, 64, 128, 256, 512) if r >= config.lora_rank),
        replica_args=replica_args,
        log_dir=logs,
    ) as fleet:
        yield fleet.base_url


def _version_args(config: TrainConfig) -> list[str]:
    """The sampler keeps the adapter versions the staleness bound needs side by side."""
    return [
        *("--adapter-versions", str(config.adapter_versions)),
        *("--version-policy", config.version_policy),
    ]


# --- 4. environments ----------------------------------------------------------------------


@contextlib.contextmanager
def environments(
    config: TrainConfig, base_url: str, out: Path
) -> Iterator[tuple[ServerDirectory, str]]:
    """The deployment the agents run in and the training file; checks the served name."""
    if config.head_url is not None:
        directory = ServerDirectory.from_head(config.head_url, wait=60)
        check_served_name(directory, config.adapter_name, backend_url=base_url)
        if config.train_file is None:
            raise ConfigError("attaching through head_url needs train_file (NeMo Gym JSONL rows)")
        yield directory, config.train_file
        return
    from nemogym_sdk.gym import GymStack, PolicyModel

    policy = PolicyModel(base_url=base_url, model=config.adapter_name)  # requests the adapter
    with GymStack(config.environments, policy, workdir=out / "gym") as stack:
        check_served_name(stack.directory, config.adapter_name, backend_url=base_url)
        first = config.environments[0]
        train = config.train_file or stack.train_paths.get(first) or stack.example_paths[first]
        yield stack.directory, str(train)


@contextlib.contextmanager
def servers(
    config: TrainConfig, out: Path, device: str, model: Any
) -> Iterator[tuple[ServerDirectory, str, LoraSync | None]]:
    """Rank 0 starts the sampler and the environments and publishes adapter version 0; every
    rank gets the deployment and the training file (the ``LoraSync`` only rank 0)."""
    with contextlib.ExitStack() as started:
        syncs: list[LoraSync] = []

        def start() -> tuple[ServerDirectory, str]:
            base_url = started.enter_context(sampler(config, out, device))
            found = started.enter_context(environments(config, base_url, out))
            sync = started.enter_context(
                LoraSync(
                    base_url,
                    config.adapter_name,
                    out / "adapters",
                    keep=max(2, config.adapter_versions),  # a kept version's files stay too
                )
            )
            sync.initialize(model, require_zero=not config.resume)  # before the first rollout
            check_versions_kept(sync, config)
            syncs.append(sync)
            return found

        directory, train_file = ranks.on_main(start)
        yield directory, train_file, (syncs[0] if syncs else None)


# --- 5. checks ----------------------------------------------------------------------------


def check_versions_kept(sync: LoraSync, config: TrainConfig) -> None:
    """Async mode: the sampler must keep ``max_staleness + 2`` adapter versions loaded and
    report the version of every turn (``nemogym_sdk.serve``, alone or in front of vLLM)."""
    if config.mode == "async":
        sync.require_versions_kept(config.adapter_versions)


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


def learn(
    played: list[Rollout], model: Any, optimizer: Any, sync: LoraSync | None, setup: Setup
) -> dict[str, Any]:
    """One step on the played rollouts: collate, advantages, ``train_step``, then the new
    adapter to the sampler (rank 0); the step's metrics over every rank, with its timings."""
    from nemogym_sdk.adapters.torch import train_step

    began = time.perf_counter()
    batch = collate(played, pad_token_id=setup.pad)
    advantages = compute_advantages(batch)
    collated = time.perf_counter()
    result = train_step(
        model,
        optimizer,
        batch,
        advantages,
        loss=setup.loss,
        micro_batch_size=setup.config.micro_batch_size,
        sampling=setup.sampling,
    )
    learned = time.perf_counter()
    # the new adapter to the sampler (rank 0; every rank learns the outcome), before the
    # next rollouts
    version = ranks.on_main(lambda: None if sync is None else sync.sync(model).version)
    synced = time.perf_counter()
    # the weights this step started from are the version before the one it published
    learner_version = None if version is None else version - 1
    stats = RolloutStats.merge(
        ranks.gather(RolloutStats.of(batch, advantages, learner_version=learner_version))
    )
    return {
        **stats.as_metrics(),
        **result.as_dict(),
        "adapter_version": version,
        "collate_s": collated - began,
        "learner_s": learned - collated,
        "sync_s": synced - learned,
    }


def run(config: TrainConfig) -> dict[str, Any]:
    """Train; returns the summary (also written to ``out/summary.json``)."""
    rank, world = setup_processes()
    if config.mode == "async" and world > 1:
        raise ConfigError(
            "--mode async runs one learner process for now (the engine plays for rank 0); "
            "use --mode sync under torchrun"
        )
    if config.rows_per_step % world:
        raise ConfigError(f"rows_per_step={config.rows_per_step} must divide among {world} ranks")
    device = resolve_device(config, int(os.environ.get("LOCAL_RANK", "0")), world)
    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    model, tokenizer = build_policy(config, device)
    setup = Setup.of(config, device, tokenizer)
    optimizer = adam(model, config)
    start, curve = load_checkpoint(model, optimizer, out) if config.resume else (0, [])
    resumed = load_state(out).get("engine", {}) if config.resume else {}
    leftover: dict[str, Any] = {}
    with (
        servers(config, out, setup.device, model) as (directory, train_file, sync),
        AgentClient(
            directory,
            sampling=setup.sampling,
            timeouts=Timeouts(request=config.episode_timeout or 600.0),
            group_affinity=config.several_samplers,  # a group's rollouts on one replica
        ) as client,
        outputs(config, out, start, rank) as log,
        contextlib.ExitStack() as closing,
    ):
        rows = load_rows(train_file, seed=config.seed)
        check_lengths(rows, tokenizer, config)
        eos = int(tokenizer.eos_token_id)
        source = closing.enter_context(play(config, client, rows, start, eos, resumed, leftover))
        for step, played in enumerate(source.steps(), start=start):
            line: dict[str, Any] = {"step": step, "device": setup.device}
            line |= {"rollout_s": played.waited_s, **played.metrics}
            line |= learn(played.rollouts, model, optimizer, sync, setup)
            source.published(line["adapter_version"])  # async: more groups may start
            line["step_s"] = (
                played.waited_s + line["collate_s"] + line["learner_s"] + line["sync_s"]
            )
            curve.append(line["reward_mean"])
            log(line)
            if rank == 0 and (
                (step + 1) % config.checkpoint_every == 0 or step + 1 == config.steps
            ):
                state = {"engine": source.state()}
                save_checkpoint(model, optimizer, out, step + 1, curve, state)
    if world > 1:
        import torch.distributed as dist

        dist.destroy_process_group()
    return finish(config, out, curve, rank, leftover)


def main(argv: Sequence[str] | None = None) -> int:
    try:
        run(parse_config(argv))
    except ConfigError as exc:  # what is wrong and how to fix it; no traceback needed
        print(f"nemogym-train: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
