"""Experiment trackers for ``nemogym-train --report-to``: every number of ``metrics.jsonl``
and the reward curve, through TensorBoard, W&B, MLflow or trackio.

Each step's line is flattened (``nemogym_sdk.metrics.scalars``: ``failures`` becomes
``failures/timeout``, ``staleness`` becomes ``staleness/0``; strings, None and ``step``
itself are left out) and logged at its step; the reward curve goes along at the last step
as an image. Offline by default, where the library allows; the user's own setting wins:

- ``tensorboard``: event files in ``out/tensorboard``;
- ``wandb``: an offline run in ``out/wandb`` (``wandb sync`` uploads it later), unless
  ``WANDB_MODE`` (also ``WANDB_PROJECT``, ``WANDB_DIR``) says otherwise;
- ``mlflow``: a SQLite store ``out/mlflow.db``, artifacts in ``out/mlartifacts``, unless
  ``MLFLOW_TRACKING_URI`` (also ``MLFLOW_EXPERIMENT_NAME``) names another;
- ``trackio``: trackio's local store (``TRACKIO_DIR``, else trackio's default).

Trackers run on rank 0 only. One that cannot start is a ``ConfigError`` before the first
step; one that fails later is dropped with a warning, and the run (and ``metrics.jsonl``)
goes on. Each library is imported when its tracker starts.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol

import attrs

from nemogym_sdk import _extras
from nemogym_sdk.errors import ConfigError
from nemogym_sdk.metrics import scalars
from nemogym_sdk.train.config import TrainConfig

__all__ = [
    "PROJECT",
    "MlflowTracker",
    "TensorBoardTracker",
    "Tracker",
    "Trackers",
    "TrackioTracker",
    "WandbTracker",
]

logger = logging.getLogger(__name__)

PROJECT = "nemogym-train"
"""The W&B project, MLflow experiment and trackio project runs go to (unless the user's
environment names another)."""


class Tracker(Protocol):
    """One experiment-tracking library, behind the calls the trainer makes."""

    def start(self, config: TrainConfig, out: Path) -> None:
        """Open a run (``config`` as its parameters) writing under ``out`` by default."""

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        """One step's flat metrics."""

    def log_image(self, step: int, name: str, path: Path) -> None:
        """A PNG file (the reward curve) at ``step``."""

    def close(self, failed: bool) -> None:
        """End the run (marked failed when the training raised)."""


def _params(config: TrainConfig) -> dict[str, Any]:
    return attrs.asdict(config)


class TensorBoardTracker:
    """Event files in ``out/tensorboard`` (``tensorboard --logdir out/tensorboard``)."""

    def start(self, config: TrainConfig, out: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(out / "tensorboard"))
        self.writer.add_text("config", f"```\n{json.dumps(_params(config), indent=1)}\n```")

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        for name, value in metrics.items():
            self.writer.add_scalar(name, value, step)
        self.writer.flush()

    def log_image(self, step: int, name: str, path: Path) -> None:
        import numpy as np
        from PIL import Image

        with Image.open(path) as image:
            pixels_HWC = np.asarray(image.convert("RGB"))
        self.writer.add_image(name, pixels_HWC, step, dataformats="HWC")

    def close(self, failed: bool) -> None:
        self.writer.close()


class WandbTracker:
    """A W&B run, offline in ``out/wandb`` unless ``WANDB_MODE`` says otherwise."""

    def start(self, config: TrainConfig, out: Path) -> None:
        import wandb

        self.wandb = wandb
        self.run = wandb.init(
            project=None if os.environ.get("WANDB_PROJECT") else PROJECT,
            name=out.resolve().name,
            dir=None if os.environ.get("WANDB_DIR") else str(out),
            mode=None if os.environ.get("WANDB_MODE") else "offline",
            config=_params(config),
        )

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        self.run.log(dict(metrics), step=step)

    def log_image(self, step: int, name: str, path: Path) -> None:
        self.run.log({name: self.wandb.Image(str(path))}, step=step)

    def close(self, failed: bool) -> None:
        self.run.finish(exit_code=1 if failed else 0)


class MlflowTracker:
    """An MLflow run: in ``out/mlflow.db`` (SQLite; artifacts in ``out/mlartifacts``)
    unless ``MLFLOW_TRACKING_URI`` names a tracking server or store."""

    def start(self, config: TrainConfig, out: Path) -> None:
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        uri = os.environ.get("MLFLOW_TRACKING_URI")
        artifacts = None
        if not uri:
            absent = _extras.missing(("sqlalchemy", "alembic"))
            if absent:
                server = "or set MLFLOW_TRACKING_URI to a tracking server"
                store = "mlflow's local SQLite store"
                raise ConfigError(_extras.needs(store, absent, "trackers", instead=server))
            uri = f"sqlite:///{(out / 'mlflow.db').resolve()}"
            artifacts = (out / "mlartifacts").resolve().as_uri()
        self.client = MlflowClient(uri)
        name = os.environ.get("MLFLOW_EXPERIMENT_NAME") or PROJECT
        found = self.client.get_experiment_by_name(name)
        experiment = (
            found.experiment_id
            if found is not None
            else self.client.create_experiment(name, artifact_location=artifacts)
        )
        self.run_id = self.client.create_run(experiment, run_name=out.resolve().name).info.run_id
        params = [Param(k, str(v)[:6000]) for k, v in _params(config).items()]  # MLflow's cap
        self.client.log_batch(self.run_id, params=params)

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [Metric(name, value, now, step) for name, value in metrics.items()]
        self.client.log_batch(self.run_id, metrics=batch)

    def log_image(self, step: int, name: str, path: Path) -> None:
        self.client.log_artifact(self.run_id, str(path))

    def close(self, failed: bool) -> None:
        self.client.set_terminated(self.run_id, status="FAILED" if failed else "FINISHED")


class TrackioTracker:
    """A trackio run in trackio's local store (``TRACKIO_DIR``, else trackio's default;
    ``trackio show --project nemogym-train``)."""

    def start(self, config: TrainConfig, out: Path) -> None:
        import trackio

        self.trackio = trackio
        self.run = trackio.init(project=PROJECT, config=_params(config))

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        self.run.log(dict(metrics), step=step)

    def log_image(self, step: int, name: str, path: Path) -> None:
        self.run.log({name: self.trackio.Image(str(path))}, step=step)

    def close(self, failed: bool) -> None:
        self.run.finish()  # type: ignore[no-untyped-call]


TRACKER_TYPES: dict[str, type[Tracker]] = {
    "tensorboard": TensorBoardTracker,
    "wandb": WandbTracker,
    "mlflow": MlflowTracker,
    "trackio": TrackioTracker,
}


class Trackers:
    """The trackers of one run, started together (``Trackers.start``); a tracker that
    fails after its start is dropped, with a warning, and the others go on."""

    def __init__(self, started: Mapping[str, Tracker]) -> None:
        self.started = dict(started)

    @classmethod
    def start(cls, names: Iterable[str], config: TrainConfig, out: Path) -> Trackers:
        """Start each named tracker (``TrainConfig.report_to``), in order.

        Raises:
            ConfigError: one could not start (the ones already started are closed).
        """
        trackers = cls({})
        for name in dict.fromkeys(names):
            tracker = TRACKER_TYPES[name]()
            try:
                tracker.start(config, out)
            except Exception as exc:
                trackers.close(failed=True)
                if isinstance(exc, ConfigError):
                    raise
                raise ConfigError(
                    f"report_to: {name} could not start ({type(exc).__name__}: {exc}); fix "
                    f"its setup or drop it from --report-to"
                ) from exc
            trackers.started[name] = tracker
        return trackers

    def log(self, line: Mapping[str, Any]) -> None:
        """A line of ``metrics.jsonl``, at its ``step``, to every tracker."""
        step = int(line["step"])
        metrics = scalars({k: v for k, v in line.items() if k != "step"})
        self._each("log", step, metrics)

    def log_image(self, step: int, name: str, path: Path) -> None:
        """A PNG (the reward curve) to every tracker."""
        self._each("log_image", step, name, path)

    def close(self, failed: bool = False) -> None:
        """End every run; a tracker that fails to close is reported, not raised."""
        self._each("close", failed)
        self.started.clear()

    def _each(self, method: str, *args: Any) -> None:
        for name, tracker in list(self.started.items()):
            try:
                getattr(tracker, method)(*args)
            except Exception:  # a tracker must not stop the training (logged)
                logger.warning("report_to: %s failed (%s); dropped", name, method, exc_info=True)
                self.started.pop(name, None)
