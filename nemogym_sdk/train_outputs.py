"""The reference trainer's outputs: ``metrics.jsonl``, checkpoints, the summary and the curve.

- ``outputs``: per step, a line of ``metrics.jsonl`` (rank 0) and the progress bar;
- ``save_checkpoint`` / ``load_checkpoint``: ``checkpoints/step_NNNNNN`` (the adapter, the
  optimizer state, the curve so far) and ``--resume``;
- ``finish``: ``summary.json`` and ``reward_curve.png``, and where everything is.

Imports torch, peft, tqdm and matplotlib inside the functions that need them.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from nemogym_sdk.errors import ConfigError
from nemogym_sdk.train_config import TrainConfig

__all__ = [
    "finish",
    "load_checkpoint",
    "open_metrics",
    "outputs",
    "plot_curve",
    "progress",
    "save_checkpoint",
]


@contextlib.contextmanager
def outputs(config: TrainConfig, out: Path, start: int, rank: int) -> Iterator[Any]:
    """``log(step, line)``: a line of ``metrics.jsonl`` (rank 0) and the progress bar."""
    bar = progress(config, start, rank)
    metrics_file = open_metrics(out / "metrics.jsonl", start) if rank == 0 else None

    def log(line: dict[str, Any]) -> None:
        if metrics_file is not None:
            metrics_file.write(json.dumps(line) + "\n")
            metrics_file.flush()
        bar.update(1)
        bar.set_postfix(reward=f"{line['reward_mean']:.3f}", fail=sum(line["failures"].values()))

    try:
        yield log
    finally:
        bar.close()
        if metrics_file is not None:
            metrics_file.close()


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


def save_checkpoint(
    model: Any,
    optimizer: Any,
    out: Path,
    step: int,
    curve: list[float],
    extra: Mapping[str, Any] | None = None,
) -> Path:
    """``out/checkpoints/step_NNNNNN``: the adapter, the optimizer state, the curve so far,
    and ``extra`` in ``state.json`` (the async engine's untrained groups)."""
    import torch

    path = out / "checkpoints" / f"step_{step:06d}"
    model.save_pretrained(path)
    torch.save(optimizer.state_dict(), path / "optimizer.pt")
    (path / "state.json").write_text(json.dumps({**(extra or {}), "step": step, "curve": curve}))
    return path


def load_state(out: Path) -> dict[str, Any]:
    """The newest checkpoint's ``state.json`` (``{}`` when there is none)."""
    found = sorted((out / "checkpoints").glob("step_*"))
    if not found or not (found[-1] / "state.json").is_file():
        return {}
    state = json.loads((found[-1] / "state.json").read_text())
    return state if isinstance(state, dict) else {}


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


def finish(
    config: TrainConfig,
    out: Path,
    curve: list[float],
    rank: int,
    leftover: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """``summary.json`` and ``reward_curve.png`` (rank 0); print where everything is.

    ``leftover`` is what the rollout side left untrained at the end (async mode)."""
    head, tail = curve[: min(5, len(curve))], curve[-min(5, len(curve)) :]
    summary: dict[str, Any] = {
        "steps": len(curve),
        "mode": config.mode,
        "curve": curve,
        "first5": sum(head) / len(head) if head else None,
        "last5": sum(tail) / len(tail) if tail else None,
    }
    if leftover:
        summary["leftover"] = dict(leftover)
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
