"""``nemogym-train --report-to`` end to end through real NeMo Gym: every tracker holds every
number of ``metrics.jsonl`` at its step, read back through each library's own reader
(``tests/test_train_trackers.py`` has the readers), and the reward curve."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from nemogym_sdk.train.config import TRACKERS
from tests import warm
from tests.test_train_trackers import (
    assert_same,
    expected_series,
    need,
    read_mlflow,
    read_tensorboard,
    read_trackio,
    read_wandb,
)

from .deployment import ToyDeployment

pytestmark = [
    pytest.mark.gym,
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),  # SQLAlchemy 2.1, in MLflow
]


def train(out: Path, *flags: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    done = warm.run(warm.train_argv("--out", str(out), *flags), env=env)  # a new process
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def test_every_tracker_gets_every_metric(toy_deployment: ToyDeployment, tmp_path: Path) -> None:
    """Two steps with all four trackers, offline defaults (W&B offline in ``out/wandb``,
    MLflow in ``out/mlflow.db``, TensorBoard in ``out/tensorboard``, trackio in its store):
    each holds exactly ``metrics.jsonl``'s numbers at their steps, and the curve at step 1."""
    need("tensorboard", "torch", "wandb", "mlflow", "sqlalchemy", "alembic", "trackio")
    out, store = tmp_path / "run", tmp_path / "trackio"
    unset = ("PYTHONDONTWRITEBYTECODE", "MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME")
    env = {k: v for k, v in os.environ.items() if k not in unset and not k.startswith("WANDB_")}
    env |= {"TRACKIO_DIR": str(store), "MLFLOW_DISABLE_TELEMETRY": "true"}
    flags = ("--steps", "2", "--rows-per-step", "2", "--num-generations", "4")
    done = train(out, *toy_deployment.flags, *flags, "--report-to", ",".join(TRACKERS), env=env)
    lines: list[dict[str, Any]] = [
        json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()
    ]
    assert [line["step"] for line in lines] == [0, 1]
    want = expected_series(lines)
    assert {"reward_mean", "loss", "rollout_s", "adapter_version"} <= set(want)

    read, images = read_tensorboard(out)
    assert_same(read, want, rel=1e-6)  # float32
    assert images == [1]
    read, images = read_wandb(out)
    assert_same(read, want, rel=0)
    assert images == [1]
    read, artifacts = read_mlflow(out)
    assert_same(read, want, rel=0)
    assert artifacts == ["reward_curve.png"]
    read, images = read_trackio(store)
    assert_same(read, want, rel=0)
    assert images == [1]
    assert "stale=" in done.stderr and "reward=" in done.stderr  # the progress bar
