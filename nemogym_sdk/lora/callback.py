"""A ``transformers`` ``TrainerCallback`` that publishes the LoRA adapter after every step.

Trainers built on ``transformers.Trainer`` (TRL's ``GRPOTrainer``, axolotl's trainers) sync
weights only to an inference engine they manage themselves. With NeMo Gym the sampler is
the server NeMo Gym's model server points at, so the adapter goes there, by name, through
``LoraSync``: version 0 (the zero adapter, equal to the base model) before the first
rollout, then one version per optimizer step, each confirmed in ``/v1/models``.

Imports transformers: import this module, not ``nemogym_sdk.lora``, to get it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from nemogym_sdk import ranks
from nemogym_sdk.directory import ServerDirectory
from nemogym_sdk.errors import ConfigError, LoraSyncError
from nemogym_sdk.lora.served_name import check_served_name
from nemogym_sdk.lora.sync import LoraSync, SyncRecord

__all__ = ["LoraSyncCallback"]


class LoraSyncCallback(TrainerCallback):
    """Sync the trainer's LoRA adapter to the sampler, on the main process only.

    Add it with ``trainer.add_callback(LoraSyncCallback(sync, deployment=directory))``.

    - ``on_train_begin``: checks that NeMo Gym's model servers request
      ``sync.adapter_name`` from ``sync.base_url`` (when ``deployment`` is given), then
      publishes version 0 (``LoraSync.initialize``; skipped if ``sync`` already has).
    - ``on_step_end`` (after each optimizer step): publishes the next version, so the
      next rollouts sample the weights just trained.

    Only the main process touches the server; with several processes every rank waits
    for its outcome and all raise if it failed. Failures are errors, never warnings: a
    sampler left on an old adapter would train on stale rollouts without a sign.

    Args:
        sync: the ``LoraSync`` to publish through; ``None`` on processes other than the
            main one is fine.
        deployment: the ``ServerDirectory`` (``ServerDirectory.from_head``, or
            ``GymStack.directory``) whose model servers must request the adapter by name
            (see ``check_served_name``).
        require_zero: version 0 must be the zero adapter (see ``LoraSync.initialize``).
        log_path: if set, each step's publish is a JSON line there (``step``, ``version``,
            the ``served_version`` read back from ``/v1/models``, ``seconds``).
        on_publish: called on every rank with each version published after a step (e.g.
            ``RolloutEngine.publish``, so episodes paced by the staleness bound may start).
    """

    def __init__(
        self,
        sync: LoraSync | None,
        *,
        deployment: ServerDirectory | None = None,
        require_zero: bool = True,
        log_path: str | Path | None = None,
        on_publish: Callable[[int], None] | None = None,
    ) -> None:
        self.sync = sync
        self.on_publish = on_publish
        self.deployment = deployment
        self.require_zero = require_zero
        self.log_path = Path(log_path) if log_path is not None else None
        self.records: list[SyncRecord] = []
        """Every publish this callback made, oldest first (main process only)."""

    def _main_sync(self) -> LoraSync:
        if self.sync is None:
            raise ConfigError("LoraSyncCallback needs a LoraSync on the main process")
        return self.sync

    def _begin(self, model: Any) -> None:
        sync = self._main_sync()
        if self.deployment is not None:
            check_served_name(self.deployment, sync.adapter_name, backend_url=sync.base_url)
        if sync.version is None:
            self.records.append(sync.initialize(model, require_zero=self.require_zero))

    def _publish(self, model: Any, step: int) -> int:
        sync = self._main_sync()
        began = time.perf_counter()
        record = sync.sync(model)
        self.records.append(record)
        if self.log_path is None:
            return record.version
        served = sync.served_version()
        if served != record.version:
            raise LoraSyncError(
                f"published adapter version {record.version}, but the server serves {served}"
            )
        line = {
            "step": step,
            "version": record.version,
            "served_version": served,
            "adapter_name": record.adapter_name,
            "seconds": round(time.perf_counter() - began, 3),
        }
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("a") as handle:
            handle.write(json.dumps(line) + "\n")
        return record.version

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """On the main process: check the served name against ``deployment`` (when given)
        and publish the starting adapter, unless ``sync`` already holds a version."""
        model = kwargs.get("model")
        ranks.on_main(lambda: self._begin(model), is_main=bool(state.is_world_process_zero))

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Publish the adapter the optimizer step made as the next version (main process;
        with ``log_path``, check it is served and log it), then hand the version to
        ``on_publish``."""
        model, step = kwargs.get("model"), int(state.global_step)
        version = ranks.on_main(
            lambda: self._publish(model, step), is_main=bool(state.is_world_process_zero)
        )
        if self.on_publish is not None:
            self.on_publish(version)
