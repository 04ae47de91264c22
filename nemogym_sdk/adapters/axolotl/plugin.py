"""``NemoGymPlugin``: NeMo Gym environments in an axolotl GRPO run, listed in its YAML.

Which axolotl hook does what (axolotl 0.19 calls them in this order):

1. ``register(cfg)``, on the raw YAML on every rank: config defaults only
   (``apply_config_defaults``), no file, network or process work.
2. ``get_input_args``: the pydantic model of the ``nemo_gym_*`` keys; its validator
   checks them during axolotl's own validation.
3. ``load_datasets``: the ``nemo_gym_datasets`` JSONL files as opaque rows with ids.
4. ``get_training_args``: ``dataloader_num_workers=0`` into the trainer's arguments.
5. ``post_trainer_create``: once, on the main process, discovery and every check that
   needs the servers (head server, agents of every row, the served-name rule, the LoRA
   routes, adapter version 0 published); the other ranks receive the result. Then the
   wiring: agent mode gives the trainer a ``NemoGymDataProducer`` and a
   ``LoraSyncCallback``; verify mode binds ``nemo_gym_verify_reward``.
6. ``post_train_unload``: closes connections.

Never done: monkey-patching a class, subclassing axolotl's trainer, appending reward
functions (the YAML lists exactly one; see ``check_reward_functions``).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from nemogym_sdk import ranks
from nemogym_sdk.adapters.axolotl.dataset import build_dataset, row_of
from nemogym_sdk.adapters.axolotl.hooks import AxolotlPluginHooks
from nemogym_sdk.adapters.axolotl.rewards import nemo_gym_verify_reward
from nemogym_sdk.adapters.axolotl.settings import (
    ENV_REWARD,
    PLUGIN,
    REWARD_FUNCTIONS,
    VERIFY_REWARD,
    NemoGymSettings,
    apply_config_defaults,
    cfg_get,
)
from nemogym_sdk.directory import ServerDirectory
from nemogym_sdk.errors import ConfigError, DiscoveryError, UnknownAgentError
from nemogym_sdk.records import TaskRow

__all__ = ["NemoGymPlugin", "check_reward_functions", "discover"]

logger = logging.getLogger(__name__)

ARGS_MODEL = "nemogym_sdk.adapters.axolotl.args.NemoGymArgs"


def check_reward_functions(reward_funcs: Sequence[object], settings: NemoGymSettings) -> None:
    """Exactly one NeMo Gym reward function, the one of this mode, in the trainer.

    The plugin never adds a reward function itself (adding one to a trainer that already
    lists it counted the environment's reward twice, and an added function without a
    weight broke ``reward_weights``); the YAML lists it once, and this checks that.

    Raises:
        ConfigError: it is missing, listed more than once, or the other mode's.
    """
    from nemogym_sdk.adapters.axolotl import rewards

    ours = {
        id(rewards.nemo_gym_env_reward): ENV_REWARD,
        id(rewards.nemo_gym_verify_reward): VERIFY_REWARD,
    }
    found = [ours[id(f)] for f in reward_funcs if id(f) in ours]
    want = settings.reward_function
    if found == [want]:
        return
    mode = "nemo_gym_multi_turn: true" if settings.multi_turn else "nemo_gym_multi_turn: false"
    if not found:
        problem = "no NeMo Gym reward function"
    elif len(found) > 1:
        problem = f"{len(found)} NeMo Gym reward functions ({', '.join(found)})"
    else:
        problem = f"{found[0]}, the other mode's reward function"
    raise ConfigError(
        f"the trainer has {problem}; with {mode} list it exactly once under trl.reward_funcs: "
        f"'- {want}' (the plugin adds none, so the environment's reward is counted once; other "
        f"reward functions may follow, with trl.reward_weights one per function). NeMo Gym "
        f"reward functions: {', '.join(REWARD_FUNCTIONS)}."
    )


def _rows(dataset: Any) -> list[TaskRow]:
    return [row_of(dataset[i]) for i in range(len(dataset))]


def discover(settings: NemoGymSettings, rows: Sequence[TaskRow]) -> ServerDirectory:
    """Ask the head server for the deployment and check that every row can be served.

    Returns the deployment (``nemo_gym_default_agent`` set as its default agent; without
    it, the only agent is the default: ``ServerDirectory.default_agent``).

    Raises:
        NotReadyError: the head server did not answer within ``discovery_timeout``.
        UnknownAgentError: a row names an agent that is not deployed, or has no agent and
            no default agent can be chosen (the row id says which), or
            ``nemo_gym_default_agent`` is not deployed.
        DiscoveryError: single-turn: a row's resources server cannot be found
            (``nemogym_sdk.verify.resources_server_for``).
        ConfigError: agent mode: NeMo Gym's model server does not request the adapter
            name (``check_served_name``).
    """
    from nemogym_sdk.lora import check_served_name
    from nemogym_sdk.verify import resources_server_for

    directory = ServerDirectory.from_head(settings.head_url, wait=settings.discovery_timeout)
    try:
        directory = directory.with_default_agent(settings.default_agent)
    except UnknownAgentError as exc:
        raise UnknownAgentError(f"nemo_gym_default_agent: {exc} (at {settings.head_url})") from None
    for row in rows:
        if settings.multi_turn:
            _check_agent(row, directory, settings)
        else:
            try:
                resources_server_for(row.data, directory, default=settings.resources_server)
            except DiscoveryError as exc:
                raise DiscoveryError(
                    f"row {row.row_id}: {exc}. Set nemo_gym_resources_server or the row's "
                    "resources_server_ref.name"
                ) from None
    if settings.multi_turn:
        assert settings.sampler_url is not None  # NemoGymSettings requires it in this mode
        check_served_name(directory, settings.adapter_name, backend_url=settings.sampler_url)
    return directory


def _check_agent(row: TaskRow, directory: ServerDirectory, settings: NemoGymSettings) -> None:
    agents = directory.agents
    agent = row.agent_name or directory.default_agent
    if agent is None:
        raise UnknownAgentError(
            f"row {row.row_id} has no agent_ref and the deployment has {len(agents)} agents "
            f"({', '.join(agents)}): set nemo_gym_default_agent"
        )
    if agent not in agents:
        raise UnknownAgentError(
            f"row {row.row_id} names agent {agent!r}, which is not deployed at "
            f"{settings.head_url} (agents: {', '.join(agents) or '(none)'}); rows are never "
            "sent to another agent instead"
        )


class NemoGymPlugin(AxolotlPluginHooks):
    """Train on NeMo Gym environments with axolotl's GRPO: ``plugins:`` lists this class.

    Importable and constructible without axolotl or torch; the hooks that need them import
    them and raise ``ImportError`` naming ``pip install 'nemogym-sdk[axolotl]'``. See
    ``docs/axolotl.md`` for the YAML keys.
    """

    def __init__(self) -> None:
        self.settings: NemoGymSettings | None = None
        """The validated settings, once a hook after ``register`` has read them."""
        self.directory: ServerDirectory | None = None
        """The deployment discovery found, once ``post_trainer_create`` has run."""
        self.producer: Any = None
        """Agent mode: the ``NemoGymDataProducer`` given to the trainer."""
        self._closers: list[Any] = []

    # --- configuration ----------------------------------------------------------------------

    def apply_config_defaults(self, cfg: Any) -> None:
        """Set the config values the plugin needs (see ``settings.apply_config_defaults``)."""
        apply_config_defaults(cfg)

    def register(self, cfg: Any) -> None:
        """Config defaults only: ``register`` runs on every rank on the raw YAML, before
        validation, so it reads no file, starts nothing and sends no request."""
        self.apply_config_defaults(cfg)

    def get_input_args(self) -> str:
        """The pydantic model of the ``nemo_gym_*`` keys (``args.NemoGymArgs``)."""
        return ARGS_MODEL

    def get_training_args(self, cfg: Any) -> dict[str, Any]:
        """Arguments merged into the trainer's own, after axolotl computed its base ones."""
        return {"dataloader_num_workers": 0}

    def _settings(self, cfg: Any) -> NemoGymSettings:
        self.settings = NemoGymSettings.from_cfg(cfg)
        return self.settings

    # --- data -------------------------------------------------------------------------------

    def load_datasets(self, cfg: Any, preprocess: bool = False) -> Any:
        """The training set, read from ``nemo_gym_datasets`` (replaces axolotl's ``datasets``)."""
        from nemogym_sdk.adapters.axolotl._deps import require_axolotl

        require_axolotl()
        from axolotl.common.datasets import TrainDatasetMeta

        settings = self._settings(cfg)
        dataset = build_dataset(settings)
        logger.info(
            "NeMo Gym plugin: %d rows from %d file(s)", len(dataset), len(settings.datasets)
        )
        return TrainDatasetMeta(train_dataset=dataset, eval_dataset=None, total_num_steps=None)

    # --- start ------------------------------------------------------------------------------

    def post_trainer_create(self, cfg: Any, trainer: Any) -> None:
        """Discover and check the deployment (main process), then wire the trainer."""
        settings = self._settings(cfg)
        check_reward_functions(list(getattr(trainer, "reward_funcs", [])), settings)
        if settings.multi_turn:
            _check_agent_trainer(cfg, trainer)
        output_dir = Path(str(cfg_get(cfg, "output_dir") or trainer.args.output_dir))
        is_main = bool(trainer.accelerator.is_main_process)
        syncs: list[Any] = []  # the LoraSync lives on the main process only

        def start() -> ServerDirectory:
            found = discover(settings, _rows(trainer.train_dataset))
            if settings.multi_turn:
                syncs.append(_start_sync(settings, trainer, output_dir))
            return found

        directory = ranks.on_main(start, is_main=is_main)
        self.directory = directory
        sync = syncs[0] if syncs else None
        if sync is not None:
            self._closers.append(sync)
        if settings.multi_turn:
            self._wire_agents(settings, directory, trainer, sync, output_dir)
        else:
            self._wire_verify(settings, directory, trainer)
        if is_main:
            _write_startup(output_dir / "nemo_gym" / "startup.json", settings, directory, trainer)

    def _wire_agents(
        self,
        settings: NemoGymSettings,
        directory: ServerDirectory,
        trainer: Any,
        sync: Any,
        output_dir: Path,
    ) -> None:
        from nemogym_sdk.adapters.axolotl._deps import require_axolotl

        require_axolotl()
        from nemogym_sdk.lora.callback import LoraSyncCallback

        producer = _data_producer(settings, directory, trainer, output_dir)
        self.producer = producer
        self._closers.append(producer)
        # axolotl 0.19's deferred scoring reads trainer.eos_token_id / trainer.pad_token_id,
        # which TRL's GRPOTrainer stopped defining (TRL 1.9 keeps them on its tokenizer):
        # without them the first batch fails with AttributeError. Supply them on this
        # instance, only where missing (no class is touched).
        for name in ("eos_token_id", "pad_token_id"):
            if getattr(trainer, name, None) is None:
                setattr(trainer, name, getattr(producer, name))
        _install_producer(trainer, producer)
        # version 0 is already published (discovery); the callback publishes every step
        trainer.add_callback(
            LoraSyncCallback(
                sync,
                log_path=output_dir / "nemo_gym" / "syncs.jsonl",
                on_publish=producer.published,  # async: more groups may start
            )
        )
        logger.info(
            "NeMo Gym plugin: agents %s; %d groups x %d rollouts per rank per batch%s",
            ", ".join(directory.agents),
            producer.schedule.rows_per_rank,
            producer.num_generations,
            ""
            if settings.max_staleness is None
            else f", asynchronous (max staleness {settings.max_staleness} versions)",
        )

    def _wire_verify(
        self, settings: NemoGymSettings, directory: ServerDirectory, trainer: Any
    ) -> None:
        from nemogym_sdk.policy import Timeouts
        from nemogym_sdk.verify import Verifier

        verifier = Verifier(
            directory,
            model_name=settings.adapter_name,
            timeouts=Timeouts(connect=5.0, request=settings.verify_timeout),
            max_concurrency=settings.max_concurrency,
        )
        # axolotl's deferred scoring (a trainer with a data producer) sums a None reward into
        # the group mean as 0; TRL's own scoring leaves it out. Impute only for the former.
        deferred = getattr(trainer, "data_producer", None) is not None
        nemo_gym_verify_reward.bind(
            verifier, resources_server=settings.resources_server, impute=deferred
        )
        self._closers.append(nemo_gym_verify_reward)

    def on_rollouts_scored(
        self,
        cfg: Any,
        trainer: Any,
        prompts: list[str],
        completions: list[str],
        rewards: dict[str, list[float]],
        advantages: list[float],
    ) -> None:
        """After axolotl scored a batch (main process, main thread): that batch's rollout
        metrics (``nemo_gym/ok_fraction``, ``nemo_gym/failures/<status>``, staleness, ...)
        join the trainer's own metrics, which its ``log`` averages per logging step and
        sends wherever ``report_to`` points (``use_tensorboard``, ``use_wandb``, ...)."""
        store = getattr(trainer, "_metrics", {}).get("train")
        if self.producer is None or store is None:
            return
        for name, value in self.producer.take_metrics().items():
            if value == value:  # NaN (no OK rollout) stays out of the running means
                store[name].append(value)

    # --- end --------------------------------------------------------------------------------

    def post_train_unload(self, cfg: Any) -> None:
        """Close the agent client, the LoRA sync session and the verifier."""
        while self._closers:
            closer = self._closers.pop()
            if closer is nemo_gym_verify_reward:
                nemo_gym_verify_reward.unbind()
            else:
                closer.close()


def _check_agent_trainer(cfg: Any, trainer: Any) -> None:
    if getattr(trainer, "data_producer", None) is None:
        raise ConfigError(
            "nemo_gym_multi_turn needs axolotl's async GRPO trainer (trl.use_data_producer: "
            "true, which the plugin sets unless the YAML sets it false); "
            f"got {type(trainer).__name__} without a data producer"
        )
    if getattr(trainer, "use_vllm", False):
        raise ConfigError(
            "nemo_gym_multi_turn: set trl.use_vllm: false. NeMo Gym's agents sample from "
            "nemo_gym_sampler_url and the plugin publishes the adapter there; the trainer's "
            "own vLLM client would sync weights a second way"
        )
    adapter = cfg_get(cfg, "adapter")
    if adapter not in ("lora", "qlora"):
        raise ConfigError(
            f"nemo_gym_multi_turn publishes the policy as a LoRA adapter: set adapter: lora "
            f"(got adapter: {adapter!r})"
        )


def _start_sync(settings: NemoGymSettings, trainer: Any, output_dir: Path) -> Any:
    """Publish adapter version 0 before the first rollout (main process)."""
    from nemogym_sdk.lora import LoraSync

    assert settings.sampler_url is not None
    directory = settings.adapter_dir or output_dir / "nemo_gym" / "adapters"
    keep = 2 if settings.max_staleness is None else settings.max_staleness + 2
    sync = LoraSync(settings.sampler_url, settings.adapter_name, directory, keep=keep)
    try:
        sync.initialize(trainer.model)
        if settings.max_staleness is not None:
            sync.require_versions_kept(settings.max_staleness + 2)
    except BaseException:
        sync.close()
        raise
    return sync


def _data_producer(
    settings: NemoGymSettings, directory: ServerDirectory, trainer: Any, output_dir: Path
) -> Any:
    """The ``NemoGymDataProducer`` that rolls out this rank's groups through the agents."""
    from nemogym_sdk.adapters.axolotl.producer import NemoGymDataProducer, Pacing
    from nemogym_sdk.adapters.axolotl.schedule import GroupSchedule
    from nemogym_sdk.client import AgentClient
    from nemogym_sdk.policy import SamplingParams, Timeouts

    args = trainer.args
    accelerator = trainer.accelerator
    num_generations = int(trainer.num_generations)
    per_rank = int(args.per_device_train_batch_size) * int(args.steps_per_generation)
    if per_rank % num_generations:
        raise ConfigError(
            f"micro_batch_size x steps per generation ({per_rank}) must be a multiple of "
            f"trl.num_generations ({num_generations}): each rank rolls out whole groups"
        )
    pacing = None
    if settings.max_staleness is not None:
        steps = int(args.steps_per_generation) * int(getattr(args, "num_iterations", 1) or 1)
        if steps != int(args.gradient_accumulation_steps):
            raise ConfigError(
                "nemo_gym_max_staleness counts adapter versions, one per optimizer step and one "
                "batch per optimizer step: set trl.steps_per_generation to "
                f"gradient_accumulation_steps ({args.gradient_accumulation_steps}) and "
                f"trl.num_iterations to 1 (got {args.steps_per_generation} and "
                f"{getattr(args, 'num_iterations', 1)})"
            )
        pacing = Pacing(
            max_staleness=settings.max_staleness,
            max_inflight=settings.max_inflight,
            episode_timeout=settings.run_timeout,
            publish_timeout=settings.run_timeout,
        )
    client = AgentClient(
        directory,
        sampling=SamplingParams(temperature=args.temperature, top_p=args.top_p),
        timeouts=Timeouts(request=settings.run_timeout),
        max_concurrency=settings.max_concurrency,
    )
    tokenizer = trainer.processing_class
    eos_token_id = int(tokenizer.eos_token_id)
    pad_token_id = int(
        tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos_token_id
    )
    return NemoGymDataProducer(
        client=client,
        dataset=trainer.train_dataset,
        schedule=GroupSchedule(
            num_rows=len(trainer.train_dataset),
            rows_per_rank=per_rank // num_generations,
            rank=accelerator.process_index,
            world=accelerator.num_processes,
            seed=settings.seed,
        ),
        num_generations=num_generations,
        config=trainer.data_producer.config,
        eos_token_id=eos_token_id,
        pad_token_id=pad_token_id,
        max_completion_length=args.max_completion_length,
        mask_truncated_completions=bool(getattr(args, "mask_truncated_completions", False)),
        log_path=output_dir / "nemo_gym" / "rollouts.jsonl",
        pacing=pacing,
    )


def _install_producer(trainer: Any, producer: Any) -> None:
    """Give axolotl's async GRPO trainer ``producer`` (wrapped for background prefetch)."""
    from axolotl.core.trainers.grpo.async_trainer import AsyncDataProducer

    previous = trainer.data_producer
    wired: Any = producer
    if getattr(trainer.args, "async_prefetch", False):
        wired = AsyncDataProducer(producer, background_produce_kwargs={"skip_policy_logps": True})
    # axolotl's async GRPO trainer reads its producer from this instance attribute (its
    # only extension point for a data producer); set on this trainer, no class touched.
    trainer.data_producer = wired
    if hasattr(previous, "shutdown"):
        previous.shutdown()


def _write_startup(
    path: Path, settings: NemoGymSettings, directory: ServerDirectory, trainer: Any
) -> None:
    """Record what the run was wired with (read by people, and by the end-to-end test)."""
    weights = getattr(trainer, "reward_weights", None)
    facts = {
        "plugin": PLUGIN,
        "mode": "agents" if settings.multi_turn else "verify",
        "trainer": type(trainer).__name__,
        "data_producer": type(getattr(trainer, "data_producer", None)).__name__,
        "dataloader_num_workers": trainer.args.dataloader_num_workers,
        "reward_funcs": list(getattr(trainer, "reward_func_names", [])),
        "reward_weights": [float(w) for w in weights] if weights is not None else None,
        "agents": directory.agents,
        "adapter_name": settings.adapter_name,
        "sampler_url": settings.sampler_url,
        "head_url": settings.head_url,
        "max_staleness": settings.max_staleness,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(facts, indent=2))
