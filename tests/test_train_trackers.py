"""nemogym-train's ``--report-to``: metric lines through each tracking library, read back
with that library's own reader; the progress bar; the config checks.

Every tracker gets the same three lines, shaped like real ``metrics.jsonl`` lines (the
SDK's ``RolloutStats`` names, learner numbers, a device string, an adapter version that
is None at first); step 7 has no ``OK`` rollout, so its ``reward_mean`` is NaN. A key that
a line lacks (``failures/timeout`` at step 5, ``staleness/1`` but at step 6) must be
absent at that step in the tracker too.
"""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import pytest

from nemogym_sdk.errors import ConfigError
from nemogym_sdk.metrics import RolloutStats, scalars
from nemogym_sdk.train.config import TrainConfig
from nemogym_sdk.train.outputs import outputs
from nemogym_sdk.train.trackers import PROJECT, TRACKER_TYPES, Trackers
from tests.require import absent

REPO = Path(__file__).resolve().parents[1]
PNG = b"\x89PNG\r\n\x1a\n"
Series = dict[str, dict[int, float]]
"""Per metric name, its value at each step."""


def need(*modules: str) -> None:
    for module in modules:
        if importlib.util.find_spec(module) is None:
            absent(f"{module} is not installed (pip install 'nemogym-sdk[trackers]')")


def metric_lines() -> list[dict[str, Any]]:
    """Three ``metrics.jsonl`` lines, steps 5-7 (a resumed run's numbering)."""
    lines = []
    steps = [(16, 0, {}), (13, 3, {"0": 40, "1": 24}), (0, 16, {})]  # OK, timeouts, staleness
    for index, (ok, timeouts, behind) in enumerate(steps):
        stats = RolloutStats(
            episodes=16,
            samples=16,
            statuses={"ok": ok, "timeout": timeouts},
            ok_reward_sum=ok * (0.25 + index / 7),
            ok_reward_square_sum=ok * (0.25 + index / 7) ** 2,
            ok_turns_sum=3 * ok,
            ok_samples=ok,
            policy_tokens=64 * ok,
            env_tokens=10 * ok,
            truncated=index,
            groups=2,
            degenerate_groups=2 if ok == 0 else 0,
            zero_spread_groups=1,
            staleness=behind,
        )
        lines.append(
            {
                "step": 5 + index,
                "device": "cpu",
                "rollout_s": 1.25 + index / 3,
                **stats.as_metrics(),
                "loss": 1 / 3 - index / 100,
                "mismatch_max": 1.5e-6 * (index + 1),
                "adapter_version": None if index == 0 else index,
            }
        )
    return lines


def expected_series(lines: list[dict[str, Any]]) -> Series:
    series: Series = {}
    for line in lines:
        for name, value in scalars({k: v for k, v in line.items() if k != "step"}).items():
            series.setdefault(name, {})[line["step"]] = value
    return series


def test_every_number_of_a_line_is_a_metric() -> None:
    """The flat metrics every tracker gets (``expected_series``): each number of a line by
    its name, a dict's items as ``name/key``, at the line's step; no string, no None."""
    lines = metric_lines()
    want = expected_series(lines)
    assert want["failures/timeout"] == {6: 3.0, 7: 16.0}
    assert want["staleness/0"] == {6: 40.0} and want["staleness/1"] == {6: 24.0}
    assert want["adapter_version"] == {6: 1.0, 7: 2.0}
    assert want["ok"] == {5: 16.0, 6: 13.0, 7: 0.0} and math.isnan(want["reward_mean"][7])
    numbers = {k for line in lines for k, v in line.items() if isinstance(v, int | float)}
    assert set(want) == numbers - {"step"} | {"failures/timeout", "staleness/0", "staleness/1"}


def write_run(names: tuple[str, ...], out: Path) -> list[dict[str, Any]]:
    """Log ``metric_lines`` and a reward curve through the named trackers, as ``outputs``
    does; the lines."""
    lines = metric_lines()
    trackers = Trackers.start(names, TrainConfig(report_to=names, out=str(out)), out)
    for line in lines:
        trackers.log(line)
    curve = out / "reward_curve.png"
    from nemogym_sdk.train.outputs import plot_curve

    plot_curve([line["reward_mean"] for line in lines], curve, title="test")
    trackers.log_image(lines[-1]["step"], "reward_curve", curve)
    trackers.close()
    return lines


def assert_same(read: Mapping[str, Mapping[int, float]], want: Series, *, rel: float) -> None:
    assert set(read) == set(want), set(read) ^ set(want)
    for name, steps in want.items():
        assert set(read[name]) == set(steps), name
        for step, value in steps.items():
            got = read[name][step]
            assert got == pytest.approx(value, rel=rel, nan_ok=True), (name, step, got, value)
            assert math.isnan(got) == math.isnan(value), (name, step)


# --- each library's own reader (the end-to-end test uses them too) -------------------------


def read_tensorboard(out: Path) -> tuple[Series, list[int]]:
    """Every scalar in ``out/tensorboard`` by TensorBoard's ``EventAccumulator``, and the
    steps of the reward-curve images (each checked to be a PNG)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(out / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()
    tags = events.Tags()
    assert tags["tensors"] == ["config/text_summary"]
    read = {tag: {e.step: e.value for e in events.Scalars(tag)} for tag in tags["scalars"]}
    images = events.Images("reward_curve")
    assert all(image.encoded_image_string.startswith(PNG) for image in images)
    return read, [image.step for image in images]


def read_wandb(out: Path) -> tuple[Series, list[int]]:
    """Every metric of the one offline W&B run in ``out/wandb``, from its ``.wandb``
    transaction log by W&B's own reader (``wandb leet inspect --json``); the steps of the
    reward-curve images (each checked to be a PNG in the run's files)."""
    (run_dir,) = (out / "wandb").glob("offline-run-*")
    argv = [sys.executable, "-m", "wandb", "leet", "inspect", "--json", str(run_dir)]
    env = {"PATH": "/usr/bin:/bin", "HOME": str(run_dir), "WANDB_MODE": "offline"}
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    records = [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
    read: Series = {}
    images = []
    for record in records:
        if record.get("type") != "history":
            continue
        item = record["history"]["item"]
        for name, value in item.items():
            if name == "reward_curve.path":
                assert (run_dir / "files" / value).read_bytes().startswith(PNG)
                images.append(item["_step"])
            elif not name.startswith(("_", "reward_curve.")):
                read.setdefault(name, {})[item["_step"]] = float(value)  # NaN is "NaN"
    return read, images


def read_mlflow(out: Path) -> tuple[Series, list[str]]:
    """Every metric's history of the one run in ``out/mlflow.db`` by ``MlflowClient``; the
    run's artifacts (each checked to be stored under ``out/mlartifacts``)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{out / 'mlflow.db'}")
    experiment = client.get_experiment_by_name(PROJECT)
    assert experiment is not None
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.status == "FINISHED" and "mlflow" in run.data.params["report_to"]
    read = {
        name: {m.step: m.value for m in client.get_metric_history(run.info.run_id, name)}
        for name in run.data.metrics
    }
    artifacts = [a.path for a in client.list_artifacts(run.info.run_id)]
    for path in artifacts:
        assert next((out / "mlartifacts").rglob(path)).read_bytes().startswith(PNG)
    return read, artifacts


TRACKIO_READER = """
import json, sys
from pathlib import Path
from trackio.sqlite_storage import SQLiteStorage

if sys.argv[3]:
    from tests.test_train_trackers import write_run

    write_run(("trackio",), Path(sys.argv[3]))
(run,) = SQLiteStorage.get_runs(sys.argv[1])
Path(sys.argv[2]).write_text(json.dumps(SQLiteStorage.get_logs(sys.argv[1], run)))
"""


def read_trackio(store: Path, write_to: Path | None = None) -> tuple[Series, list[int]]:
    """Every metric of the one run of the trackio store ``store`` by trackio's
    ``SQLiteStorage``; the steps of the reward-curve images (each checked to be a PNG in
    its media directory). trackio reads ``TRACKIO_DIR`` when it is imported, hence a
    process of its own; with ``write_to``, that process runs ``write_run`` there first."""
    logs = store.parent / "trackio_logs.json"
    argv = [sys.executable, "-c", TRACKIO_READER, PROJECT, str(logs), str(write_to or "")]
    env = {"PATH": "/usr/bin:/bin", "HOME": str(store.parent), "TRACKIO_DIR": str(store)}
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    read: Series = {}
    images = []
    for row in json.loads(logs.read_text()):
        for name, value in row.items():
            if isinstance(value, dict):
                assert value["_type"] == "trackio.image" and name == "reward_curve"
                assert (store / "media" / value["file_path"]).read_bytes().startswith(PNG)
                images.append(row["step"])
            elif name not in ("step", "timestamp"):
                read.setdefault(name, {})[row["step"]] = float(value)
    return read, images


# --- each library, through Trackers ----------------------------------------------------------


def test_tensorboard_event_files_hold_every_metric(tmp_path: Path) -> None:
    """Every metric at its step (float32: TensorBoard stores scalars as such), the config
    as text and the curve as a PNG image at the last step."""
    need("tensorboard", "torch")
    want = expected_series(write_run(("tensorboard",), tmp_path))
    read, images = read_tensorboard(tmp_path)
    assert_same(read, want, rel=1e-6)
    assert images == [7]


def test_wandb_offline_run_holds_every_metric(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Offline by default: the run lands in ``out/wandb/offline-run-*``; its transaction
    log holds every metric at its step (doubles: exact) and the curve as an image file."""
    need("wandb")
    for name in ("WANDB_MODE", "WANDB_DIR", "WANDB_PROJECT", "WANDB_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    want = expected_series(write_run(("wandb",), tmp_path))
    read, images = read_wandb(tmp_path)
    assert_same(read, want, rel=0)
    assert images == [7]


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # SQLAlchemy 2.1, inside MLflow
def test_mlflow_local_store_holds_every_metric(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without MLFLOW_TRACKING_URI the run goes to ``out/mlflow.db``: every metric at its
    step, the config as parameters, the curve as an artifact under ``out/mlartifacts``."""
    need("mlflow", "sqlalchemy", "alembic")
    for name in ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")  # no usage reports from a test
    want = expected_series(write_run(("mlflow",), tmp_path))
    read, artifacts = read_mlflow(tmp_path)
    assert_same(read, want, rel=0)
    assert artifacts == ["reward_curve.png"]


def test_trackio_local_store_holds_every_metric(tmp_path: Path) -> None:
    """trackio's local store (``TRACKIO_DIR``): every metric at its step and the curve as
    an image in its media directory."""
    need("trackio")
    (tmp_path / "run").mkdir()
    read, images = read_trackio(tmp_path / "store", write_to=tmp_path / "run")
    assert_same(read, expected_series(metric_lines()), rel=0)
    assert images == [7]


# --- failures, the hook in outputs(), the progress bar --------------------------------------


class FailingTracker:
    """A tracker whose library breaks after the first step (a full disk, a lost server)."""

    steps: ClassVar[list[int]] = []

    def start(self, config: TrainConfig, out: Path) -> None:
        pass

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        FailingTracker.steps.append(step)
        if len(FailingTracker.steps) > 1:
            raise OSError("disk full")

    def log_image(self, step: int, name: str, path: Path) -> None:
        raise AssertionError("dropped trackers get nothing more")

    def close(self, failed: bool) -> None:
        raise AssertionError("dropped trackers get nothing more")


def test_a_tracker_failing_mid_run_loses_nothing_elsewhere(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The failing tracker is dropped with a warning; metrics.jsonl and TensorBoard get
    every line, and the curve at the end."""
    need("tensorboard", "torch")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    need("wandb")  # stands in for it: TrainConfig checks that the name is installed
    monkeypatch.setitem(TRACKER_TYPES, "wandb", FailingTracker)
    monkeypatch.setattr(FailingTracker, "steps", [])
    config = TrainConfig(report_to=("wandb", "tensorboard"), out=str(tmp_path), steps=8)
    lines = metric_lines()
    with outputs(config, tmp_path, 5, rank=0) as log:
        for line in lines:
            log(line)
    assert FailingTracker.steps == [5, 6]
    assert "report_to: wandb failed (log); dropped" in caplog.text
    written = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in written] == [5, 6, 7]
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert [e.step for e in events.Scalars("reward_mean")] == [5, 6, 7]
    assert [e.step for e in events.Images("reward_curve")] == [7]
    assert (tmp_path / "reward_curve.png").read_bytes().startswith(PNG)


def test_a_tracker_that_cannot_start_is_a_config_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """MLflow pointed at a store it cannot open: a ConfigError naming the tracker, before
    any step, with nothing written."""
    need("mlflow")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "nosuchscheme://nowhere")
    config = TrainConfig(report_to=("mlflow",), out=str(tmp_path))
    with (
        pytest.raises(ConfigError, match=r"report_to: mlflow could not start .*--report-to"),
        outputs(config, tmp_path, 0, rank=0),
    ):
        raise AssertionError("no step may run")
    assert not (tmp_path / "metrics.jsonl").exists()


def test_other_ranks_start_no_tracker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    need("mlflow")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "nosuchscheme://nowhere")  # would fail to start
    config = TrainConfig(report_to=("mlflow",), out=str(tmp_path))
    with outputs(config, tmp_path, 0, rank=1) as log:
        log(metric_lines()[0])
    assert list(tmp_path.iterdir()) == []


def test_the_progress_bar_shows_reward_failures_and_staleness(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One step of three: the bar shows the step's mean reward, failed episodes and
    staleness (mean/max versions behind), and tqdm's ETA."""
    pytest.importorskip("tqdm")
    line = metric_lines()[1]
    with outputs(TrainConfig(steps=3, out=str(tmp_path)), tmp_path, 0, rank=0) as log:
        log(line)
    err = capsys.readouterr().err
    reward = f"{line['reward_mean']:.3f}"
    assert "1/3 [" in err and "<" in err  # elapsed<remaining: the ETA
    assert f"reward={reward}, fail=3, stale=0.38/1" in err, err
    assert json.loads((tmp_path / "metrics.jsonl").read_text())["step"] == 6


# --- the config ------------------------------------------------------------------------------


def test_report_to_names_known_installed_trackers(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match=r"unknown tracker.*'tensorbord'.*tensorboard, wandb"):
        TrainConfig(report_to=("tensorbord",))
    monkeypatch.setitem(sys.modules, "trackio", None)  # not importable here
    with pytest.raises(
        ConfigError, match=r"report_to needs trackio: .*nemogym-sdk\[trackers\].*or trackio alone"
    ):
        TrainConfig(report_to=("trackio",))
    assert TrainConfig().report_to == ()
