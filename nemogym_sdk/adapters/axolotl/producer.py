"""Agent-mode rollouts for axolotl's async GRPO trainer: a data producer built from the SDK.

axolotl's async GRPO trainer (``trl.use_data_producer: true``) asks its data producer for
each new batch: ``producer.produce(model, global_step, processing_class=, accelerator=,
args=)`` returns a ``RolloutDataset`` whose ``_pending_policy_logps`` marker makes the
trainer score it on the main thread (``_compute_deferred_scores``: rewards from the
``_deferred_inputs`` rows, policy logprobs, advantages per group of ``num_generations``).

``NemoGymDataProducer.produce`` does not generate. Per call it takes this rank's next rows
(``GroupSchedule``, whole groups), plays each ``num_generations`` times through NeMo Gym's
agents (``AgentClient``: concurrent, retried, cookie-isolated; unknown agents are errors),
parses every ``/run`` result (``Rollout``, token-exact, with a status) and pads them
(``collate``). The batch it returns:

==============================  ============================================================
``prompt_ids``/``prompt_mask``  ``[B, P]`` left-padded
``completion_ids``/``_mask``    ``[B, T]`` right-padded; the mask comes from lengths
``sampling_per_token_logps``    ``[B, T]`` the sampler's logprobs, 0.0 on environment tokens
``tool_mask``                   ``[B, T]`` 1 on policy tokens, 0 on environment tokens; 0 on the
                                whole row of a failed (or masked, or truncated with
                                ``mask_truncated_completions``) rollout, so it adds no loss
``num_items_in_batch``          tokens the loss touches (policy tokens of usable rollouts)
``advantages``                  zeros (the trainer fills them in)
``_pending_policy_logps``       True: the trainer scores the batch itself
``_deferred_inputs``            one dict per rollout: the dataset record (row id, row JSON,
                                prompt) plus ``env_reward``, ``nemo_gym_ok``,
                                ``nemo_gym_group``, ``nemo_gym_status``, ``num_turns``
==============================  ============================================================

Rollouts come back in ``aabb`` order (the groups the trainer normalises over). Every rank
rolls out its own rows; with ``async_prefetch`` the trainer wraps this producer in its
``AsyncDataProducer``.

**Asynchronous** (``pacing``, YAML ``nemo_gym_max_staleness: K``): a ``RolloutEngine`` keeps
this rank's episodes playing while the learner learns, and ``produce`` hands out the next
whole groups it finished (overdue ones first), so no group is trained more than ``K``
adapter versions after the one it started on. The trainer's ``LoraSyncCallback`` tells the
producer of every version it publishes (``published``), which lets more groups start; each
episode ends at ``nemo_gym_run_timeout`` as a ``TIMEOUT`` failure at the latest. ``close``
cancels what is still playing and logs which groups were left untrained. In both modes each
line of ``log_path`` has the staleness of the batch's policy tokens against the weights
that train it (one adapter version per optimizer step).
"""

from __future__ import annotations

import collections
import json
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs
import torch

from nemogym_sdk import ranks
from nemogym_sdk.adapters.axolotl._deps import require_axolotl
from nemogym_sdk.adapters.axolotl.dataset import PROMPT, row_of
from nemogym_sdk.adapters.axolotl.rewards import ENV_REWARD_COLUMN, GROUP_COLUMN, OK_COLUMN
from nemogym_sdk.adapters.axolotl.schedule import GroupSchedule
from nemogym_sdk.client import AgentClient
from nemogym_sdk.collate import collate
from nemogym_sdk.errors import UsageError
from nemogym_sdk.metrics import RolloutStats, scalars
from nemogym_sdk.records import ParseOptions, Rollout
from nemogym_sdk.rollout_engine import EngineOptions, RolloutEngine

__all__ = ["STATUS_COLUMN", "VERSION_COLUMN", "NemoGymDataProducer", "Pacing"]

logger = logging.getLogger(__name__)

STATUS_COLUMN = "nemo_gym_status"
"""Per rollout: its ``RolloutStatus`` value."""
VERSION_COLUMN = "nemo_gym_policy_version"
"""Per rollout: the oldest adapter version that sampled one of its turns (-1: unknown)."""


@attrs.frozen(kw_only=True)
class Pacing:
    """How the asynchronous producer paces its ``RolloutEngine``."""

    max_staleness: int
    """Adapter versions a group may be trained behind the one it started on."""
    max_inflight: int | None = None
    """Episodes playing at once on this rank (None: all the pacing allows)."""
    episode_timeout: float | None = None
    """Seconds an episode may play before it ends as ``TIMEOUT``."""
    publish_timeout: float = 1800.0
    """Seconds ``produce`` may wait for the next adapter version before it gives up."""


class NemoGymDataProducer:
    """axolotl data producer that rolls out through NeMo Gym agents.

    Args:
        client: the agent client (the plugin builds it from the discovered deployment).
        dataset: the training set the plugin's ``load_datasets`` built (records with
            ``nemo_gym_row_id`` / ``nemo_gym_row``); indexable.
        schedule: which rows this rank plays per call.
        num_generations: rollouts per row (``trl.num_generations``).
        config: the trainer's ``ProducerConfig`` (read by axolotl's ``AsyncDataProducer``).
        eos_token_id: the tokenizer's eos (failed rollouts are one ``[eos]`` token).
        pad_token_id: padding id of the tensors.
        max_completion_length: completions longer than this are cut (and marked truncated).
        mask_truncated_completions: leave truncated rollouts out of the loss.
        log_path: a JSON line per call (statuses, rewards, turns, agents, staleness) on the
            main process; the same numbers wait in ``take_metrics`` for the trainer's log.
        pacing: play asynchronously through a ``RolloutEngine`` (see the module doc);
            None plays each batch when asked.
    """

    def __init__(
        self,
        *,
        client: AgentClient,
        dataset: Any,
        schedule: GroupSchedule,
        num_generations: int,
        config: Any,
        eos_token_id: int,
        pad_token_id: int,
        max_completion_length: int | None = None,
        mask_truncated_completions: bool = False,
        log_path: str | Path | None = None,
        pacing: Pacing | None = None,
    ) -> None:
        self.client = client
        self.dataset = dataset
        self.schedule = schedule
        self.num_generations = num_generations
        self.config = config
        self.eos_token_id = eos_token_id
        self.pad_token_id = pad_token_id
        self.max_completion_length = max_completion_length
        self.mask_truncated_completions = mask_truncated_completions
        self.log_path = Path(log_path) if log_path is not None else None
        self.pacing = pacing
        self.engine_options = self._options(pacing) if pacing is not None else None
        """How the engine of asynchronous mode plays (checked here, before it starts)."""
        self.calls = 0
        """Produce calls so far."""
        self.engine: RolloutEngine | None = None
        """The engine of asynchronous mode, once the first ``produce`` started it."""
        self._first_step: int | None = None  # global step of the first call: version 0
        self._engine_records: list[dict[str, Any]] = []
        self._engine_metrics: dict[str, float] = {}
        self._pending_metrics: collections.deque[dict[str, float]] = collections.deque()

    # --- the axolotl protocol ---------------------------------------------------------------

    def produce(
        self,
        model: Any,
        global_step: int,
        *,
        processing_class: Any = None,
        accelerator: Any = None,
        args: Any = None,
        skip_policy_logps: bool = False,
        _rank0_only: bool = False,
        **kwargs: Any,
    ) -> Any:
        """The next batch as axolotl's ``RolloutDataset`` (always deferred scoring).

        ``skip_policy_logps`` changes nothing (the trainer computes policy logprobs on the
        main thread either way). With ``_rank0_only`` (several processes, background
        prefetch) ranks other than 0 return None and receive rank 0's batch by broadcast.
        """
        require_axolotl()
        from axolotl.core.trainers.grpo.async_trainer import RolloutDataset

        is_main = getattr(accelerator, "is_main_process", True)
        if _rank0_only and not is_main:
            return None
        data = self.rollout_data(
            global_step,
            device=getattr(accelerator, "device", None),
            decode=getattr(processing_class, "batch_decode", None),
            accelerator=None if _rank0_only else accelerator,
            log=bool(is_main),
        )
        data["_rank0_only"] = _rank0_only
        return RolloutDataset(data)

    def on_rollout_begin(self, global_step: int) -> None:
        """axolotl lifecycle hook (nothing to do)."""

    def on_rollout_end(self, dataset: Any, global_step: int) -> None:
        """axolotl lifecycle hook (nothing to do)."""

    def take_metrics(self) -> dict[str, float]:
        """The rollout metrics (``nemo_gym/<name>``, flat) of the oldest logged batch not
        taken yet, or ``{}``. The trainer scores batches in the order they were produced,
        so taking one per scored batch pairs each batch with its own (``NemoGymPlugin``
        does, into the trainer's log). Thread-safe: a background ``produce`` may append."""
        try:
            return self._pending_metrics.popleft()
        except IndexError:
            return {}

    def published(self, version: int) -> None:
        """The sampler serves a new adapter version (``LoraSyncCallback(on_publish=...)``):
        in asynchronous mode, more groups may start."""
        if self.engine is not None:
            self.engine.publish(version)

    def close(self) -> None:
        """Cancel the episodes still playing (logging the groups left untrained), then
        close the agent client."""
        try:
            if self.engine is not None:
                self.engine.close()
                self.engine = None
        finally:
            self.client.close()

    # --- the batch --------------------------------------------------------------------------

    def _start_engine(self) -> RolloutEngine:
        """The engine over this rank's rows (a seeded order, cycled), started once."""
        if self.engine_options is None:
            raise UsageError("this producer plays synchronously (no pacing): it has no engine")
        if self.engine is None:
            indices = self.schedule.rank_order()
            self._engine_records = [dict(self.dataset[i]) for i in indices]
            self.engine = RolloutEngine(
                self.client,
                [row_of(record) for record in self._engine_records],
                self.engine_options,
                eos_token_id=self.eos_token_id,
            ).start()
        return self.engine

    def _options(self, pacing: Pacing) -> EngineOptions:
        return EngineOptions(
            num_generations=self.num_generations,
            groups_per_step=self.schedule.rows_per_rank,
            max_staleness=pacing.max_staleness,
            max_inflight=pacing.max_inflight,
            episode_timeout=pacing.episode_timeout,
            parse=self._parse,
        )

    @property
    def _parse(self) -> ParseOptions:
        return ParseOptions(max_completion_length=self.max_completion_length)

    def _play(self) -> tuple[list[dict[str, Any]], list[Rollout]]:
        """(one dataset record per group, the rollouts in ``aabb`` order) for this call."""
        if self.pacing is None:
            records = [dict(self.dataset[i]) for i in self.schedule.next_indices()]
            rollouts = self.client.run_sync(
                [row_of(record) for record in records],
                eos_token_id=self.eos_token_id,
                num_generations=self.num_generations,
                parse=self._parse,
            )
            return records, rollouts
        try:
            step = self._start_engine().next_step(
                self.pacing.publish_timeout, wait_for_publish=True
            )
        except TimeoutError:
            raise TimeoutError(
                f"no adapter version was published for {self.pacing.publish_timeout:g} s while "
                "the rollout engine waited for one (nemo_gym_max_staleness paces episodes by "
                "the versions LoraSyncCallback publishes after each optimizer step)"
            ) from None
        self._engine_metrics = step.metrics()
        size = len(self._engine_records)
        records = [dict(self._engine_records[group.index % size]) for group in step.groups]
        return records, step.rollouts()

    def learner_version(self, global_step: int) -> int:
        """The adapter version of the weights that train the batch of ``global_step``: one
        version is published per optimizer step, version 0 before the first call's step."""
        if self._first_step is None:
            self._first_step = global_step
        return global_step - self._first_step

    def rollouts(self, global_step: int) -> tuple[list[dict[str, Any]], list[Rollout]]:
        """Play this rank's next rows; (one input record per rollout, the rollouts), ``aabb``."""
        records, rollouts = self._play()
        inputs = []
        for index, rollout in enumerate(rollouts):  # in input order: aabb
            position = index // self.num_generations
            record = records[position]
            inputs.append(
                {
                    **record,
                    ENV_REWARD_COLUMN: float(rollout.reward),
                    OK_COLUMN: self._usable(rollout),
                    GROUP_COLUMN: f"{global_step}:{self.schedule.rank}:{position}",
                    STATUS_COLUMN: rollout.status.value,
                    VERSION_COLUMN: _or_minus_one(rollout.oldest_version),
                    "num_turns": int(rollout.num_turns),
                }
            )
        return inputs, rollouts

    def _usable(self, rollout: Rollout) -> bool:
        return rollout.ok and not (self.mask_truncated_completions and rollout.truncated)

    def rollout_data(
        self,
        global_step: int,
        *,
        device: Any = None,
        decode: Any = None,
        accelerator: Any = None,
        log: bool = True,
    ) -> dict[str, Any]:
        """The deferred-scoring batch dict (see the module docstring for its keys)."""
        began = time.perf_counter()
        learner_version = self.learner_version(global_step)
        inputs, rollouts = self.rollouts(global_step)
        batch = collate(rollouts, pad_token_id=self.pad_token_id, expand_forks=False)
        tensors = batch.to_torch(device)
        usable_B = torch.tensor([row[OK_COLUMN] for row in inputs], dtype=torch.long)
        usable_B = usable_B.to(tensors["env_mask"].device)
        tool_mask_BT = tensors["env_mask"] * usable_B[:, None]
        trainable = (tensors["completion_mask"] * tool_mask_BT).sum()
        stats = RolloutStats.of(batch, learner_version=learner_version)
        if accelerator is not None and getattr(accelerator, "num_processes", 1) > 1:
            trainable = accelerator.gather(trainable.reshape(1)).sum()
            stats = RolloutStats.merge(ranks.gather(stats))
        completion_lists = [r.completion_ids.tolist() for r in rollouts]
        if decode is not None:
            completions = list(decode(completion_lists, skip_special_tokens=True))
        else:
            completions = ["" for _ in rollouts]
        data: dict[str, Any] = {
            "prompt_ids": tensors["prompt_ids"],
            "prompt_mask": tensors["prompt_mask"],
            "completion_ids": tensors["completion_ids"],
            "completion_mask": tensors["completion_mask"],
            "sampling_per_token_logps": tensors["logprobs"],
            "tool_mask": tool_mask_BT,
            "num_items_in_batch": trainable.clamp(min=1),
            "advantages": torch.zeros(len(rollouts), device=tensors["prompt_ids"].device),
            "_pending_policy_logps": True,
            "_deferred_inputs": inputs,
            "_deferred_prompts": [row.get(PROMPT) for row in inputs],
            "_deferred_completions": completions,
            "_deferred_completion_ids_list": completion_lists,
        }
        self.calls += 1
        if log:
            self._log(global_step, stats, rollouts, time.perf_counter() - began)
        return data

    def _log(
        self,
        global_step: int,
        stats: RolloutStats,
        rollouts: Sequence[Rollout],
        seconds: float,
    ) -> None:
        """A line of ``log_path``: the SDK's step metrics (every rank's rollouts when the
        ranks play together), this rank's agents, the first failure, the seconds taken."""
        line = {
            "step": global_step,
            **stats.as_metrics(),
            **self._engine_metrics,
            "agents": dict(collections.Counter(str(r.agent_name) for r in rollouts)),
            "seconds": round(seconds, 3),
        }
        errors = [r.error for r in rollouts if not r.ok and r.error]
        if errors:
            line["first_error"] = errors[0]
            logger.warning(
                "step %d: %d of %d rollouts failed (left out of the loss and the baselines); "
                "first: %s",
                global_step,
                sum(not r.ok for r in rollouts),
                len(rollouts),
                errors[0],
            )
        self._pending_metrics.append(
            scalars({**stats.as_metrics(), **self._engine_metrics}, "nemo_gym/")
        )
        if self.log_path is not None:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            with self.log_path.open("a") as handle:
                handle.write(json.dumps(line) + "\n")


def _or_minus_one(version: int | None) -> int:
    return -1 if version is None else version
