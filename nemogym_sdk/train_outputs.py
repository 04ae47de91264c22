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
    "load_adapter_checkpoint",
    "load_checkpoint",
    "load_optimizer_checkpoint",
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
    *,
    write: bool = True,
) -> Path:
    """``out/checkpoints/step_NNNNNN``: the adapter, the optimizer state, the curve so far,
    and ``extra`` in ``state.json`` (the async engine's untrained groups).

    The adapter and the optimizer state are gathered in full (a collective for a model
    sharded with FSDP2: every rank calls this, the one with ``write`` writes), so a
    checkpoint resumes on any number of ranks, sharded or not."""
    import torch

    model_state, optimizer_state = _full_learner_state(model, optimizer)
    path = out / "checkpoints" / f"step_{step:06d}"
    if write:
        from nemogym_sdk.lora._adapter import save_adapter

        path.mkdir(parents=True, exist_ok=True)
        save_adapter(model, path, state_dict=model_state)
        torch.save(optimizer_state, path / "optimizer.pt")
        state = {**(extra or {}), "step": step, "curve": curve}
        (path / "state.json").write_text(json.dumps(state))
    return path


def _full_learner_state(model: Any, optimizer: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True, ignore_frozen_params=True)
    return get_state_dict(model, optimizer, options=options)


def load_state(out: Path) -> dict[str, Any]:
    """The newest checkpoint's ``state.json`` (``{}`` when there is none)."""
    found = sorted((out / "checkpoints").glob("step_*"))
    if not found or not (found[-1] / "state.json").is_file():
        return {}
    state = json.loads((found[-1] / "state.json").read_text())
    return state if isinstance(state, dict) else {}


def _newest(out: Path) -> Path:
    found = sorted((out / "checkpoints").glob("step_*"))
    if not found:
        raise ConfigError(f"resume: no checkpoint in {out / 'checkpoints'}; run without --resume")
    return found[-1]


def load_adapter_checkpoint(model: Any, out: Path) -> tuple[int, list[float]]:
    """Load the newest checkpoint's adapter into ``model`` (not sharded yet); (the step to
    continue from, the curve so far)."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    path = _newest(out)
    set_peft_model_state_dict(model, load_file(str(path / "adapter_model.safetensors")))
    state = json.loads((path / "state.json").read_text())
    return int(state["step"]), [float(v) for v in state["curve"]]


def load_optimizer_checkpoint(model: Any, optimizer: Any, out: Path) -> None:
    """Load the newest checkpoint's optimizer state (sharded like ``model``, if it is)."""
    import torch
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    # map_location: a checkpoint written on a GPU resumes on a CPU too
    saved = torch.load(_newest(out) / "optimizer.pt", map_location="cpu", weights_only=True)
    options = StateDictOptions(full_state_dict=True, ignore_frozen_params=True)
    set_optimizer_state_dict(model, optimizer, optim_state_dict=saved, options=options)


def load_checkpoint(model: Any, optimizer: Any, out: Path) -> tuple[int, list[float]]:
    """Load the newest checkpoint in ``out`` into an unsharded learner; (the step to continue
    from, the curve so far)."""
    step_curve = load_adapter_checkpoint(model, out)
    load_optimizer_checkpoint(model, optimizer, out)
    return step_curve


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
