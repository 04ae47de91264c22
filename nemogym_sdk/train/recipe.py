"""nemogym-train: GRPO on NeMo Gym environments, a readable recipe built only from SDK parts.

    python -m nemogym_sdk.train --config run.yaml --steps 40      # flags override the file
    torchrun --nproc_per_node=2 -m nemogym_sdk.train --steps 10    # rollouts sharded by group
    python -m nemogym_sdk.train --mode async --max-staleness 1     # rollouts never stop
    python -m nemogym_sdk.train --replicas 4                       # samplers behind vllm-router
    torchrun --nnodes=2 --nproc_per_node=8 ... -m nemogym_sdk.train --fsdp --dtype bfloat16

A LoRA adapter on a model (the built-in tiny Llama, or a local Hugging Face directory) is
trained on rollouts that NeMo Gym's agents play; the sampler (``nemogym_sdk.serve``, or real
vLLM behind it) serves the adapter by name and gets every new version after each step.
Top to bottom:

    0. config        TrainConfig from the file and the flags (nemogym_sdk.train.config);
                     environment names, the training rows and their lengths are checked
                     before any server starts
    1. processes     one, or several under torchrun (NCCL on GPUs, gloo on CPUs); rank 0
                     owns the servers (nemogym_sdk.train.learner)
    2. model         the base model + a LoRA adapter (peft), tokenizer, on ``device``,
                     built on a thread while the servers start; after version 0 is
                     published, sharded with FSDP2 (``fsdp``) and its optimizer
    3. sampler       start the backend (transformers or vLLM, one or several replicas behind
                     vllm-router), or attach (nemogym_sdk.train.sampler); its /tokenize
                     must render a probe conversation as the learner's tokenizer does
                     (nemogym_sdk.samplers.probe)
    4. environments  start NeMo Gym (GymStack, or NeMo Gym's own launcher) beside the
                     sampler, whose port is chosen beforehand, or attach to one or several
                     deployments through their head servers
    5. checks        served name = adapter name, (async) the sampler keeps
                     max_staleness + 2 adapter versions
    6. loop          rollouts -> collate -> advantages -> train_step -> LoRA sync; the
                     rollouts come synchronously or from the RolloutEngine
                     (nemogym_sdk.train.play)
    7. outputs       metrics.jsonl and the trackers of --report-to, summary.json,
                     reward_curve.png (nemogym_sdk.train.outputs, train.trackers); atomic
                     checkpoints and --resume (nemogym_sdk.train.checkpoints)
    8. faults        SIGINT/SIGTERM, a lost sampler, failures past max_failure_rate, a
                     failed write: stop at a step boundary with a checkpoint, every server
                     stopped (nemogym_sdk.train.faults; docs/faults.md)

Everything lands in ``out``: ``metrics.jsonl`` (a line per step: the SDK's step metrics,
``nemogym_sdk.metrics.RolloutStats`` and ``adapters.torch.StepMetrics``, over every rank,
plus seconds per phase), ``checkpoints/step_NNNNNN/``, ``summary.json``,
``reward_curve.png``, ``failures.jsonl`` (a line per failed rollout: step, row, status,
reason), ``logs/`` (the samplers') and ``gym/logs/`` (NeMo Gym's servers, when the trainer
started them).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs

from nemogym_sdk import (
    AgentClient,
    Rollout,
    ServerDirectory,
    TaskRow,
    Timeouts,
    _extras,
    check_served_name,
    collate,
    compute_advantages,
    load_rows,
    ranks,
)
from nemogym_sdk.errors import ConfigError, LoraSyncError, NemoGymError
from nemogym_sdk.hosts import openai_url
from nemogym_sdk.lora import LoraSync
from nemogym_sdk.metrics import RolloutStats
from nemogym_sdk.samplers.probe import check_tokenization
from nemogym_sdk.train.checkpoints import (
    latest,
    load_state,
    resume_point,
    save_checkpoint,
)
from nemogym_sdk.train.config import REQUEST_TIMEOUT_S, TrainConfig, parse_config, resolve_device
from nemogym_sdk.train.failures import check_step
from nemogym_sdk.train.faults import (
    Interrupted,
    RunStoppedError,
    SamplerWatch,
    StopSignals,
    check_out,
    writing,
)
from nemogym_sdk.train.learner import (
    Setup,
    adapter_state,
    build_policy,
    load_tokenizer,
    prepare,
    setup_processes,
)
from nemogym_sdk.train.outputs import MetricsLog, finish, library_warnings, outputs, say
from nemogym_sdk.train.play import RolloutSource, play
from nemogym_sdk.train.sampler import finish_groups, fork_ahead, planned_url, sampler
from nemogym_sdk.train.startup import building, meanwhile
from nemogym_sdk.wire import RESPONSES_CREATE_PARAMS, input_messages

if TYPE_CHECKING:  # the learner's types; torch and peft load only when a run starts
    from peft import PeftModel
    from torch.optim import Optimizer

    from nemogym_sdk.train.learner import AdapterState, Tokenizer

__all__ = ["build_policy", "main", "run"]

logger = logging.getLogger(__name__)


HEAD_WAIT_S = 60.0
"""How long a run waits for each ``head_url`` to answer ``/readyz``."""


# --- 1. processes, 2. model: nemogym_sdk.train.learner -----------------------------------
# --- 3. sampler: nemogym_sdk.train.sampler -------------------------------------------------


# --- 4. environments ----------------------------------------------------------------------


def training_file(config: TrainConfig) -> str:
    """The training rows' file, found before anything starts, with every environment name
    checked: ``train_file``, else the first environment's ``train`` data (its example rows
    when its config names none), as NeMo Gym's parser resolves the config."""
    if config.head_url:
        if config.train_file is None:
            raise ConfigError("attaching through head_url needs train_file (NeMo Gym JSONL rows)")
        return config.train_file
    from nemogym_sdk.gym import PolicyModel, build_stack_config, find_gym_venv

    unstarted = PolicyModel(base_url="http://127.0.0.1:9/v1", model=config.adapter_name)
    env_path = config.env_path or None  # None: $NEMOGYM_ENV_PATH
    resolved = build_stack_config(
        find_gym_venv(), config.environments, unstarted, env_path=env_path
    )
    first = resolved.environment(config.environments[0])
    return config.train_file or str(first.train_path or first.example_path)


@contextlib.contextmanager
def environments(config: TrainConfig, base_url: str, out: Path) -> Iterator[list[ServerDirectory]]:
    """The deployments the agents run in; checks the served name.

    Attached through head servers (``head_url``), or started here by ``GymStack`` or NeMo
    Gym's own launcher (``launcher``)."""
    if config.head_url:
        for head in config.head_url:
            say(f"waiting for the head server at {head} (up to {HEAD_WAIT_S:g} s)...")
        deployments = [ServerDirectory.from_head(h, wait=HEAD_WAIT_S) for h in config.head_url]
        for deployment in deployments:
            check_served_name(deployment, config.adapter_name, backend_url=base_url)
        yield deployments
        return
    from nemogym_sdk.gym import GymLauncher, GymStack, PolicyModel

    policy = PolicyModel(base_url=base_url, model=config.adapter_name)  # requests the adapter
    env_path = config.env_path or None  # None: $NEMOGYM_ENV_PATH
    started: GymStack | GymLauncher = (
        GymLauncher(config.environments, policy, env_path=env_path, workdir=out / "gym")
        if config.launcher == "gym"
        else GymStack(config.environments, policy, env_path=env_path, workdir=out / "gym")
    )
    how = "gym env start" if config.launcher == "gym" else "GymStack"
    say(f"starting NeMo Gym ({how}): {', '.join(config.environments)}...")
    with started:
        check_served_name(started.directory, config.adapter_name, backend_url=base_url)
        yield [started.directory]


@contextlib.contextmanager
def servers(
    config: TrainConfig,
    out: Path,
    device: str,
    policy: Callable[[], PeftModel],
    tokenizer: Tokenizer,
    first_version: int = 0,
) -> Iterator[tuple[list[ServerDirectory], LoraSync | None, str | None, int | None]]:
    """Rank 0 starts the sampler, checks that it tokenizes as the learner does
    (`check_tokenization`), starts the environments and publishes the first adapter version
    of ``policy()`` (the model, once `building` has it; ``first_version``: the steps a
    resumed run's checkpoint holds, so the versions go on where they were); every rank gets
    the deployments (the ``LoraSync`` only rank 0),
    when the trainer started the sampler (``nemogym_sdk.serve``), its URL, where episodes
    given up on are aborted, and (async mode) how many generations it decodes at once."""
    with contextlib.ExitStack() as started:
        syncs: list[LoraSync] = []

        def start() -> tuple[list[ServerDirectory], str | None, int | None]:
            base_url, port = planned_url(config)
            if port is None:  # a sampler to attach to must answer before anything starts
                base_url = started.enter_context(sampler(config, out, device))
            # NeMo Gym starts while the sampler does (its URL is known beforehand)
            gym = started.enter_context(meanwhile(environments(config, base_url, out)))
            if port is not None:
                base_url = started.enter_context(sampler(config, out, device, port))
            if not check_tokenization(base_url, tokenizer):
                say(f"the sampler at {base_url} has no /tokenize: its tokenizer is not checked")
            found = gym()
            sync = started.enter_context(
                LoraSync(
                    base_url,
                    config.adapter_name,
                    out / "adapters",
                    keep=max(2, config.adapter_versions),  # a kept version's files stay too
                )
            )
            # before the first rollout; a resumed run's adapter is the checkpoint's
            sync.initialize(policy(), require_zero=not config.resume, version=first_version)
            check_versions_kept(sync, config)
            syncs.append(sync)
            capacity = sync.decode_capacity() if config.mode == "async" else None
            return found, (base_url if config.backend_url is None else None), capacity

        deployments, sampler_url, capacity = ranks.on_main(start)
        yield deployments, (syncs[0] if syncs else None), sampler_url, capacity


# --- 5. checks ----------------------------------------------------------------------------


def check_versions_kept(sync: LoraSync, config: TrainConfig) -> None:
    """Async mode: the sampler must keep ``max_staleness + 2`` adapter versions loaded and
    report the version of every turn (``nemogym_sdk.serve``, alone or in front of vLLM)."""
    if config.mode == "async":
        sync.require_versions_kept(config.adapter_versions)


def check_lengths(rows: Sequence[TaskRow], tokenizer: Tokenizer, config: TrainConfig) -> None:
    """Every row's prompt plus its completion budget must fit the sampler's context."""
    for row in rows:
        prompt = tokenizer.apply_chat_template(
            input_messages(row.data), add_generation_prompt=True, tokenize=True
        )
        # a BatchEncoding (transformers 5) or the ids themselves (earlier releases)
        prompt_len = len(prompt["input_ids"] if isinstance(prompt, Mapping) else prompt)
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
    played: list[Rollout],
    model: PeftModel,
    optimizer: Optimizer,
    sync: LoraSync | None,
    setup: Setup,
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
    # next rollouts; a sharded policy's adapter is gathered first (every rank takes part)
    state = adapter_state(model)
    version = ranks.on_main(lambda: publish(sync, model, state, setup.config.sync_retries))
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


def publish(
    sync: LoraSync | None, model: PeftModel, state: AdapterState, retries: int
) -> int | None:
    """The new adapter version, published (rank 0); a refused publish (every replica back on
    the last version) is tried again ``retries`` times, and the last refusal raises."""
    if sync is None:
        return None
    for attempt in range(retries):
        try:
            return sync.sync(model, state_dict=state).version
        except LoraSyncError as exc:
            logger.warning("publish refused (%s); trying again (%d left)", exc, retries - attempt)
            time.sleep(min(30.0, 2.0**attempt))
    return sync.sync(model, state_dict=state).version  # the last try: a refusal propagates


@attrs.define
class Progress:
    """How far a run got, which the stop path reads to decide on a last checkpoint."""

    out: Path
    steps: int
    """Steps finished (their metrics logged)."""
    saved: int
    """The step of the newest checkpoint."""
    consistent: bool = True
    """Whether the learner's weights are those of ``steps`` finished steps: not between the
    optimizer's update and the step's metrics line, nor after a failed checkpoint write."""

    def learning(self) -> None:
        """A step (or a checkpoint write) has started changing what a checkpoint would hold."""
        self.consistent = False

    def finished(self, steps: int) -> None:
        """``steps`` steps are finished and logged."""
        self.steps, self.consistent = steps, True

    def checkpointed(self) -> None:
        """The newest checkpoint holds the finished steps."""
        self.saved, self.consistent = self.steps, True

    def worth_a_checkpoint(self) -> bool:
        """Whether stopping now should write a checkpoint: finished steps the newest one
        lacks, with the weights between steps."""
        return self.consistent and self.steps > self.saved


def train_steps(
    source: RolloutSource,
    model: PeftModel,
    optimizer: Optimizer,
    sync: LoraSync | None,
    deployments: Sequence[ServerDirectory],
    setup: Setup,
    log: MetricsLog,
    curve: list[float],
    done: Progress,
    signals: StopSignals,
) -> None:
    """The loop: each step's rollouts checked, learned from, logged and checkpointed. A stop
    signal during the rollouts abandons the step; while it learns, the step finishes first."""
    config, rank = setup.config, ranks.rank()
    sampler = None if sync is None else openai_url(sync.base_url)
    for step, played in enumerate(source.steps(), start=done.steps):
        # stopped here, the weights are those of the finished steps (a checkpoint keeps them)
        check_step(step, played, done.out, config.max_failure_rate, sampler, deployments)
        with signals.deferred():
            done.learning()
            line: dict[str, Any] = {"step": step, "device": setup.device}
            line |= {"rollout_s": played.waited_s, **played.metrics}
            line |= learn(played.rollouts, model, optimizer, sync, setup)
            source.published(line["adapter_version"])  # async: more groups may start
            line["step_s"] = (
                played.waited_s + line["collate_s"] + line["learner_s"] + line["sync_s"]
            )
            line["trained_groups"] = played.groups  # which rows: a run can be audited
            curve.append(line["reward_mean"])
            with writing(f"{done.out / 'metrics.jsonl'}", latest(done.out)):
                log(line)
            if config.several_samplers:  # the router forgets them (every rank: collective)
                ranks.on_main(functools.partial(finish_groups, sampler, played.groups))
            done.finished(step + 1)
            if done.steps % config.checkpoint_every == 0 or done.steps == config.steps:
                checkpoint(model, optimizer, source, curve, done, write=rank == 0)


def checkpoint(
    model: PeftModel,
    optimizer: Optimizer,
    source: RolloutSource,
    curve: list[float],
    done: Progress,
    *,
    write: bool,
) -> None:
    """A checkpoint of the ``done.steps`` finished steps (every rank: a sharded policy is
    gathered; ``write`` on the one that writes)."""
    done.learning()  # a failed write is not tried again
    state = {"engine": source.state()}
    save_checkpoint(model, optimizer, done.out, done.steps, curve, state, write=write)
    done.checkpointed()


def run(config: TrainConfig, *, signals: StopSignals | None = None) -> dict[str, Any]:
    """Train; returns the summary (also written to ``out/summary.json``). With ``signals``
    (entered: ``main`` does), SIGINT and SIGTERM stop the run at a step boundary."""
    signals = signals or StopSignals()  # not entered: installs no handler
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if config.rows_per_step % world:
        raise ConfigError(f"rows_per_step={config.rows_per_step} must divide among {world} ranks")
    out = Path(config.out)
    check_out(out)  # before anything starts
    device = resolve_device(config, int(os.environ.get("LOCAL_RANK", "0")), world)
    rank, world = setup_processes(device)
    # what can be checked without a server is checked before any starts
    rows = load_rows(ranks.on_main(functools.partial(training_file, config)), seed=config.seed)
    tokenizer = load_tokenizer(config)
    check_lengths(rows, tokenizer, config)
    setup = Setup.of(config, device, tokenizer)
    resumed_from = resume_point(out) if config.resume else None
    state: dict[str, Any] = load_state(resumed_from) if resumed_from else {"step": 0, "curve": []}
    start, curve = int(state["step"]), [float(v) for v in state["curve"]]
    resumed = state.get("engine", {})
    done = Progress(out=out, steps=start, saved=start)
    leftover: dict[str, Any] = {}
    with (
        building(config, setup.device, resumed_from) as policy,
        servers(config, out, setup.device, policy, tokenizer, start) as (
            deployments,
            sync,
            at,
            capacity,
        ),
        AgentClient(
            deployments,
            sampling=setup.sampling,
            timeouts=Timeouts(request=config.episode_timeout or REQUEST_TIMEOUT_S),
            group_affinity=config.several_samplers,  # a group's rollouts on one replica
            sampler_url=at,  # an episode given up on stops generating there
        ) as client,
        outputs(config, out, start, rank) as log,
        contextlib.ExitStack() as closing,
    ):
        if sync is not None:  # a sampler that stops answering stops the run
            closing.enter_context(SamplerWatch(openai_url(sync.base_url), signals))
        model = policy()
        optimizer = prepare(model, config, resumed_from, world)  # sharded after version 0
        eos = int(tokenizer.eos_token_id)
        source = closing.enter_context(
            play(config, client, rows, start, eos, resumed, leftover, capacity)
        )
        try:
            train_steps(
                source, model, optimizer, sync, deployments, setup, log, curve, done, signals
            )
        except (Interrupted, RunStoppedError) as stopped:
            stop_checkpoint(stopped, model, optimizer, source, curve, done, world)
            raise
    if world > 1:
        import torch.distributed as dist

        dist.destroy_process_group()
    return finish(config, out, curve, rank, leftover)


def stop_checkpoint(
    stopped: BaseException,
    model: PeftModel,
    optimizer: Optimizer,
    source: RolloutSource,
    curve: list[float],
    done: Progress,
    world: int,
) -> None:
    """A run stopping mid-way keeps the steps it finished: a checkpoint at the last step
    boundary, unless the newest one is it, the weights are between steps, or (several
    processes, a stop signal) the ranks may be at different points of the step."""
    racing = world > 1 and isinstance(stopped, Interrupted)
    if done.worth_a_checkpoint() and not racing:
        checkpoint(model, optimizer, source, curve, done, write=ranks.rank() == 0)


# What nemogym-train imports from its extra ([project.optional-dependencies] train).
_TRAIN_EXTRA = ("torch", "transformers", "tokenizers", "peft", "jinja2", "tqdm", "matplotlib")


def _require_train_extra() -> None:
    """Raise ``ConfigError`` naming the ``train`` extra when a module it installs is missing."""
    absent = _extras.missing(_TRAIN_EXTRA)
    if absent:
        raise ConfigError(_extras.needs("the reference trainer", absent, "train"))


def main(argv: Sequence[str] | None = None) -> int:
    config: TrainConfig | None = None
    try:
        with library_warnings(), StopSignals() as signals:
            config = parse_config(argv)
            _require_train_extra()  # after parsing: --help works without the extra
            fork_ahead(config)  # before any thread: the sampler's fork server is this process
            run(config, signals=signals)
    except ConfigError as exc:  # what is wrong and how to fix it; no traceback needed
        print(f"nemogym-train: {exc} (see {exc.troubleshooting_url()})", file=sys.stderr)
        return 2
    except Interrupted as stop:  # SIGINT, SIGTERM: stopped cleanly, servers stopped
        kept = latest(Path(config.out)) if config is not None else None
        print(
            f"nemogym-train: stopped by {stop}; "
            + (f"checkpoint {kept}: continue with --resume" if kept else "no checkpoint yet"),
            file=sys.stderr,
        )
        return stop.exit_status
    except NemoGymError as exc:  # a server refused (an adapter, say): say which, in a line
        kept = latest(Path(config.out)) if config is not None else None
        stopped = isinstance(exc, RunStoppedError) and "checkpoint" not in str(exc)
        where = f" (checkpoint {kept}: continue with --resume)" if kept and stopped else ""
        see = f" (see {exc.troubleshooting_url()})"
        print(f"nemogym-train: {type(exc).__name__}: {exc}{where}{see}", file=sys.stderr)
        return 1
    return 0
