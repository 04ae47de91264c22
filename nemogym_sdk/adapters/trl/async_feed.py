"""TRL's ``AsyncGRPOTrainer`` fed by NeMo Gym: whole groups from a ``RolloutEngine``.

TRL 1.16's asynchronous trainer (``trl.experimental.async_grpo``) drains scored samples from
its ``rollout_worker`` and hands every new policy to its ``weight_transfer``. `NemoGymFeed`
is both: a ``RolloutEngine`` plays whole groups through NeMo Gym's agents within the
engine's staleness bound, each group becomes ``num_generations`` TRL ``RolloutSample``s (the
env mask as the completion mask, the sampler's logprobs, the SDK's GRPO advantages, the
version that sampled it, the group's number), and each weight sync publishes the adapter
through ``LoraSync`` instead of TRL's NCCL stream to its own vLLM::

    feed = NemoGymFeed(client, rows, EngineOptions(num_generations=8, groups_per_step=4,
                       max_staleness=1), sync=LoraSync(sampler_url, "policy", "adapters"),
                       eos_token_id=tokenizer.eos_token_id)
    trainer = AsyncGRPOTrainer(model_path, args=AsyncGRPOConfig(..., token_budget=0,
                               per_device_train_batch_size=8, gradient_accumulation_steps=4),
                               train_dataset=make_dataset(rows), peft_config=LoraConfig(...),
                               rollout_worker=feed, weight_transfer=feed)
    feed.attach(trainer)     # checks the cadence; the model whose adapter it publishes
    trainer.train()

One weight sync must consume exactly one engine step (``per_device_train_batch_size x
processes x gradient_accumulation_steps x weight_sync_steps == groups_per_step x
num_generations``, with ``token_budget=0`` so that TRL batches by count): the engine's pacing
counts one publish per step, and that is what bounds staleness without discarding anything.
``attach`` checks it. Failed episodes stay in their group as samples with no trained token,
so the count holds.

With several training processes (``accelerate launch`` or torchrun) every rank builds the
feed and the trainer and calls ``attach``; TRL runs the feed on rank 0 only, and its loader
deals each micro-batch out to the ranks. A sharded policy (FSDP2) is gathered on every rank
just before each of TRL's weight syncs (a collective), and rank 0 publishes the whole adapter.
"""

from __future__ import annotations

import logging
import math
import queue
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import attrs
import numpy as np

from nemogym_sdk.client import AgentClient
from nemogym_sdk.collate import collate
from nemogym_sdk.errors import ConfigError, UsageError
from nemogym_sdk.grpo import compute_advantages
from nemogym_sdk.lora import LoraSync, _adapter
from nemogym_sdk.records import DriftPolicy, Rollout, TaskRow
from nemogym_sdk.rollout_engine import EngineClosedError, EngineOptions, EngineStep, Group, Leftover

__all__ = ["NemoGymFeed"]

logger = logging.getLogger(__name__)


class NemoGymFeed:
    """``AsyncGRPOTrainer``'s ``rollout_worker`` and ``weight_transfer`` (see the module doc).

    Args:
        client: plays the episodes; its ``sampling`` must match the trainer's temperature
            and ``top_p`` (``sampling_from_args``).
        rows: the dataset; group ``n`` plays ``rows[n % len(rows)]``.
        options: the engine's (``num_generations`` must be the trainer's; ``max_staleness``
            at most the trainer's, which drops older samples).
        sync: publishes each version of the adapter to the sampler.
        eos_token_id: the one token of a failed rollout.
        scale, leave_one_out: the GRPO advantage options (``compute_advantages``).
        requeue, next_index: a resumed run's ``Leftover`` (``RolloutEngine``'s).
        first_version: the version TRL's cold sync publishes (``LoraSync.initialize``): 0,
            or for a resumed run the version its checkpoint's adapter had.
    """

    def __init__(
        self,
        client: AgentClient,
        rows: Sequence[TaskRow],
        options: EngineOptions,
        *,
        sync: LoraSync,
        eos_token_id: int,
        scale: str = "group",
        leave_one_out: bool = False,
        requeue: Iterable[int] = (),
        next_index: int = 0,
        first_version: int = 0,
    ) -> None:
        if DriftPolicy(options.parse.on_drift) is DriftPolicy.FORK:
            raise ConfigError(
                "NemoGymFeed needs one sample per episode (a weight sync consumes one engine "
                "step): use on_drift='mark' or 'raise', not 'fork'"
            )
        self.client, self.rows, self.options, self.sync = client, list(rows), options, sync
        self.eos_token_id, self.scale, self.leave_one_out = eos_token_id, scale, leave_one_out
        self._requeue, self._next_index = tuple(requeue), next_index
        self._first_version = first_version
        self.rollout_buffer: queue.Queue[Any] = queue.Queue()
        """What the trainer drains: TRL ``RolloutSample``s, a step's groups at a time."""
        self.metrics_queue: queue.Queue[dict[str, Any]] = queue.Queue()
        """The engine's figures per step, for the trainer's logs (``nemogym/*``)."""
        self.leftover: Leftover | None = None
        """What `stop` left untrained (groups to play first when resuming), once stopped; on
        rank 0 only (the other ranks' feeds never start an engine)."""
        self._trainer: Any = None
        self._engine: Any = None
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._beat = time.monotonic()
        self._served: int | None = None  # the version the last resume() published
        self._trl_version: dict[int, int] = {}  # served version -> TRL's model_version
        self._handed: list[tuple[int, ...]] = []  # each engine step's groups, in order
        self._gathered: dict[str, Any] | None = None  # a sharded adapter, for the next publish

    # --- wiring ---------------------------------------------------------------------------

    def attach(self, trainer: Any) -> None:
        """Bind the trainer (whose adapter `resume` publishes); check that one weight sync
        consumes one engine step and that the trainer keeps every sample the engine makes.
        Every training process calls it (TRL keeps the feed on rank 0 only)."""
        mine = self if trainer.accelerator.is_main_process else None  # TRL's rule
        if trainer.rollout_worker is not mine or trainer.weight_transfer is not mine:
            raise UsageError(
                "build the trainer with rollout_worker=feed and weight_transfer=feed, then "
                "call feed.attach(trainer)"
            )
        args, processes = trainer.args, trainer.accelerator.num_processes
        if args.token_budget is None or args.token_budget > 0:
            raise ConfigError(
                f"token_budget={args.token_budget}: set token_budget=0, so that the trainer "
                "batches by sample count and a weight sync consumes one engine step"
            )
        per_sync = (
            args.per_device_train_batch_size
            * processes
            * args.gradient_accumulation_steps
            * args.weight_sync_steps
        )
        per_step = self.options.groups_per_step * self.options.num_generations
        if per_sync != per_step:
            raise ConfigError(
                f"one weight sync consumes {per_sync} samples (per_device_train_batch_size x "
                f"{processes} processes x gradient_accumulation_steps x weight_sync_steps) but "
                f"an engine step holds {per_step} (groups_per_step x num_generations): make "
                "them equal"
            )
        if args.num_generations != self.options.num_generations:
            raise ConfigError(
                f"the trainer's num_generations={args.num_generations} differs from the "
                f"engine's {self.options.num_generations}"
            )
        if args.max_staleness < self.options.max_staleness:
            raise ConfigError(
                f"the trainer drops samples over max_staleness={args.max_staleness} versions "
                f"old; the engine's bound is {self.options.max_staleness}: raise the trainer's"
            )
        sampling = self.client.sampling
        if sampling.temperature != args.temperature or sampling.top_p not in (None, args.top_p):
            raise ConfigError(
                f"the client samples at temperature={sampling.temperature}, "
                f"top_p={sampling.top_p}; the trainer scores at temperature={args.temperature}, "
                f"top_p={args.top_p}: build the client with sampling_from_args(args)"
            )
        self._trainer = trainer
        if processes > 1:  # ahead of TRL's own callbacks: its cold sync and its weight syncs
            trainer.callback_handler.callbacks.insert(0, _gather_before_sync(self))

    def _gather(self) -> None:
        """Gather a sharded policy's adapter for the next publish: a collective that every
        rank runs just before each of TRL's weight syncs (``attach`` arranges it); rank 0
        keeps the result. Nothing to do for a policy that is whole on every rank."""
        model = self._trainer.accelerator.unwrap_model(self._trainer.model)
        gathered = _adapter.gather_adapter(model)
        self._gathered = gathered if self._trainer.accelerator.is_main_process else None

    # --- WeightTransferProtocol -----------------------------------------------------------

    def init_weight_transfer(self) -> None:
        """Check the sampler serves adapters before the first sync."""
        self.sync.probe()

    def pause(self) -> None:
        """Nothing to pause: the sampler swaps adapters between requests."""

    def send_weights(self, iterator: Iterator[tuple[str, Any]]) -> None:
        """Drained and dropped: the trainer streams merged base weights; the adapter is
        published unmerged, in `resume`."""
        for _ in iterator:
            pass

    def resume(self) -> None:
        """Publish the trainer's adapter as the next version (the trainer has unmerged it).
        The first publish also checks that the sampler keeps ``max_staleness + 2`` versions
        side by side and reports each turn's (``LoraSync.require_versions_kept``)."""
        if self._trainer is None:
            raise UsageError("call feed.attach(trainer) before trainer.train()")
        model = self._trainer.accelerator.unwrap_model(self._trainer.model)
        whole, self._gathered = self._gathered, None
        if whole is None and _adapter.is_sharded(model):
            raise UsageError(
                "the policy is sharded and its adapter was not gathered before this weight "
                "sync: call feed.attach(trainer) on every rank before trainer.train()"
            )
        if self.sync.version is None:  # TRL's cold sync, before the first rollout
            first = self._first_version
            record = self.sync.initialize(
                model, require_zero=first == 0, version=first, state_dict=whole
            )
            # episodes in flight keep the versions they started on: up to K behind, and the
            # one being published (a ConfigError before the first rollout otherwise)
            self.sync.require_versions_kept(self.options.max_staleness + 2)
        else:
            record = self.sync.sync(model, state_dict=whole)
        self._served = record.version

    def destroy(self) -> None:
        """Nothing to release (the ``LoraSync`` is the caller's)."""

    # --- RolloutWorkerProtocol ------------------------------------------------------------

    def update_model_version(self, model_version: int) -> None:
        """TRL's ``model_version`` is now live: the version `resume` published. After the
        first, each one lets the engine start more groups."""
        if self._served is None:
            raise UsageError("update_model_version before any adapter was published")
        self._trl_version[self._served] = model_version
        if self._engine is not None:
            self._engine.publish(self._served)

    def start(self) -> None:
        """Start the engine and the thread that hands its steps to the trainer."""
        from nemogym_sdk.rollout_engine import RolloutEngine

        if self._engine is not None:
            raise UsageError("this NemoGymFeed has already been started")
        self._engine = RolloutEngine(
            self.client,
            self.rows,
            self.options,
            eos_token_id=self.eos_token_id,
            requeue=self._requeue,
            next_index=self._next_index,
        ).start()
        self._beat = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="nemogym-feed", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Close the engine and end the thread. ``leftover`` is the engine's `Leftover`, its
        ``requeue`` also holding the groups handed to the trainer after its last weight sync
        (in its queue, fetched ahead, or in a step it did not finish): those were not trained."""
        if self._engine is None or self.leftover is not None:
            return
        closed = self._engine.close()
        if self._thread is not None:
            self._thread.join(timeout=60)
        trained = len(self._trl_version) - 1  # a publish after each step trained
        untrained = {g for groups in self._handed[max(trained, 0) :] for g in groups}
        self.leftover = attrs.evolve(closed, requeue=tuple(sorted({*closed.requeue, *untrained})))
        logger.info(
            "NemoGymFeed stopped: %d groups started and not trained (%d finished, %d "
            "episodes cancelled); resume with requeue=leftover.requeue",
            len(self.leftover.requeue),
            len(self.leftover.finished),
            self.leftover.cancelled,
        )

    def check_health(self, stale_after_s: float) -> None:
        """Raise what stopped the engine, or ``TimeoutError`` when no step was handed out for
        ``stale_after_s`` seconds while the trainer waits."""
        if self._error is not None:
            raise RuntimeError(f"the NeMo Gym rollout engine stopped: {self._error}") from (
                self._error
            )
        quiet = time.monotonic() - self._beat
        if quiet > stale_after_s:
            groups, _ = self._engine.pending() if self._engine is not None else ((), 0)
            raise TimeoutError(
                f"no NeMo Gym step for {quiet:.0f} s ({len(groups)} groups started and not "
                "handed out); a step waits for the adapter of the step before it: is the "
                "trainer syncing weights once per engine step?"
            )

    # --- the thread -----------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while True:
                played = self._engine.next_step(wait_for_publish=True)
                self._handed.append(tuple(group.index for group in played.groups))
                for group in played.groups:
                    for sample in self.samples(group):
                        self.rollout_buffer.put(sample)
                self.metrics_queue.put(_step_metrics(played))
                self._beat = time.monotonic()
        except EngineClosedError:
            return
        except BaseException as error:  # noqa: BLE001 - reported by check_health
            self._error = error
            logger.error("NemoGymFeed: the rollout engine stopped: %s", error)

    def samples(self, group: Group) -> list[Any]:
        """The group as TRL ``RolloutSample``s, one per episode, in repeat order."""
        from trl.experimental.async_grpo.async_rollout_worker import RolloutSample

        rollouts = group.rollouts
        batch = collate(rollouts, pad_token_id=self.eos_token_id, expand_forks=False)
        advantages = compute_advantages(batch, scale=self.scale, leave_one_out=self.leave_one_out)
        now = time.time()
        return [
            RolloutSample(
                prompt=[],
                completion=[],
                input_ids=np.concatenate([r.prompt_ids, r.completion_ids]).astype(np.int64),
                completion_mask=_trained(r),
                old_log_probs=np.concatenate(
                    [np.zeros(len(r.prompt_ids), np.float32), r.logprobs]
                ).astype(np.float32),
                advantage=float(advantage),
                model_version=self._version_of(r, group),
                group_id=group.index,
                metrics={"reward": float(r.reward) if r.ok else math.nan},
                enqueued_at=now,
            )
            for r, advantage in zip(rollouts, advantages.values, strict=True)
        ]

    def _version_of(self, rollout: Rollout, group: Group) -> int:
        """TRL's ``model_version`` of the oldest turn of ``rollout``; where the sampler did
        not say, the one live when its group started (TRL's 1 at the engine's start)."""
        served = [v for v in rollout.turn_versions if v is not None]
        known = [self._trl_version[v] for v in served if v in self._trl_version]
        return min(known) if known else group.started_on + 1


def _gather_before_sync(feed: NemoGymFeed) -> Any:
    """A ``TrainerCallback`` running `NemoGymFeed._gather` on every rank where TRL's weight
    syncs run (its train begin; the end of every ``weight_sync_steps``-th step), placed
    before them."""
    from transformers import TrainerCallback

    class GatherBeforeSync(TrainerCallback):
        def on_train_begin(self, args: Any, state: Any, control: Any, **_: Any) -> None:
            feed._gather()

        def on_step_end(self, args: Any, state: Any, control: Any, **_: Any) -> None:
            if state.global_step % args.weight_sync_steps == 0:  # TRL's StepIntervalCallback
                feed._gather()

    return GatherBeforeSync()


def _trained(rollout: Rollout) -> np.ndarray[Any, Any]:
    """1 on the tokens the policy generated, over prompt and completion; none for a failure."""
    mask = rollout.env_mask if rollout.ok else np.zeros_like(rollout.env_mask)
    return np.concatenate([np.zeros(len(rollout.prompt_ids), np.int64), mask.astype(np.int64)])


def _step_metrics(played: EngineStep) -> dict[str, Any]:
    """The engine's figures for one step, in the trainer's metric shapes (a rate is a pair)."""
    rollouts = [r for group in played.groups for r in group.rollouts]
    return {
        "nemogym/ok_frac": (float(sum(r.ok for r in rollouts)), float(len(rollouts))),
        "nemogym/waited_s": played.waited_s,
        "nemogym/inflight_mean": played.inflight_mean,
        "nemogym/idle_frac": played.idle_fraction,
        "nemogym/cut_total": float(played.cut),
    }
