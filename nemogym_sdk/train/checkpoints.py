"""The reference trainer's checkpoints: ``out/checkpoints/step_NNNNNN``, atomic, and
``--resume`` from the newest one that is whole.

A checkpoint holds the adapter (``adapter_model.safetensors``), the optimizer state
(``optimizer.pt``) and ``state.json`` (the step, the reward curve so far, the async
engine's untrained groups). It is written into a hidden sibling directory and renamed into
place, so a kill or a full disk mid-write never leaves a partial ``step_*``.
``resume_point`` picks the newest checkpoint that reads back whole, and reports each newer
one it skips (a checkpoint copied or edited by hand, a disk error), so ``--resume`` falls
back to the one before.

Imports torch, peft and safetensors inside the functions that need them.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from nemogym_sdk.errors import ConfigError
from nemogym_sdk.train.faults import writing

__all__ = [
    "checkpoints",
    "latest",
    "load_adapter_checkpoint",
    "load_checkpoint",
    "load_optimizer_checkpoint",
    "load_state",
    "resume_point",
    "save_checkpoint",
]

_FILES = ("adapter_model.safetensors", "adapter_config.json", "optimizer.pt", "state.json")


def checkpoints(out: Path) -> list[Path]:
    """The checkpoint directories in ``out``, oldest first (partial writes excluded)."""
    return sorted(p for p in (out / "checkpoints").glob("step_*") if p.is_dir())


def latest(out: Path) -> Path | None:
    """The newest checkpoint directory in ``out``, or None."""
    found = checkpoints(out)
    return found[-1] if found else None


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
    checkpoint resumes on any number of ranks, sharded or not. Written aside, then renamed:
    a failed write (``RunStoppedError`` naming the last good checkpoint) leaves nothing."""
    import torch

    model_state, optimizer_state = _full_learner_state(model, optimizer)
    final = out / "checkpoints" / f"step_{step:06d}"
    if not write:
        return final
    from nemogym_sdk.lora._adapter import save_adapter

    with writing(f"checkpoint {final}", latest(out)):
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.partial-", dir=final.parent))
        try:
            save_adapter(model, tmp, state_dict=model_state)
            torch.save(optimizer_state, tmp / "optimizer.pt")
            state = {**(extra or {}), "step": step, "curve": curve}
            (tmp / "state.json").write_text(json.dumps(state))
            _fsync_dir(tmp)
            if final.exists():  # this step again (a resumed run that fell back past it)
                aside = final.with_name(f".{final.name}.old-{uuid.uuid4().hex[:8]}")
                final.rename(aside)
                shutil.rmtree(aside, ignore_errors=True)
            tmp.rename(final)
            _fsync_dir(final.parent)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return final


def _fsync_dir(path: Path) -> None:
    """Flush ``path``'s files and its entry list to disk (a rename after it is durable)."""
    for entry in path.iterdir():
        if entry.is_file():
            with entry.open("rb") as handle:
                os.fsync(handle.fileno())
    handle_fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(handle_fd)
    finally:
        os.close(handle_fd)


def _full_learner_state(model: Any, optimizer: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True, ignore_frozen_params=True)
    return get_state_dict(model, optimizer, options=options)


def resume_point(out: Path) -> Path:
    """The newest checkpoint in ``out`` that reads back whole; each newer one that does not
    is reported (on stderr) and skipped. ``ConfigError`` when there is none."""
    found = checkpoints(out)
    if not found:
        raise ConfigError(f"resume: no checkpoint in {out / 'checkpoints'}; run without --resume")
    skipped: list[str] = []
    for path in reversed(found):
        problem = _unreadable(path)
        if problem is None:
            if skipped:
                print(
                    f"nemogym-train: resuming from {path.name}: skipped {'; '.join(skipped)}",
                    file=sys.stderr,
                    flush=True,
                )
            return path
        skipped.append(f"{path.name} ({problem})")
    raise ConfigError(
        f"resume: no usable checkpoint in {out / 'checkpoints'}: {'; '.join(skipped)}; "
        "run without --resume, or restore a checkpoint"
    )


def _unreadable(path: Path) -> str | None:
    """Why the checkpoint at ``path`` cannot be resumed from, or None when it reads whole."""
    import torch
    from safetensors.torch import load_file

    missing = [name for name in _FILES if not (path / name).is_file()]
    if missing:
        return f"missing {', '.join(missing)}"
    try:
        state = json.loads((path / "state.json").read_text())
        int(state["step"]), [float(v) for v in state["curve"]]
        load_file(str(path / "adapter_model.safetensors"))
        torch.load(path / "optimizer.pt", map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - whatever a damaged file raises, it is reported
        return f"{type(exc).__name__}: {str(exc)[:120]}"
    return None


def load_state(checkpoint: Path) -> dict[str, Any]:
    """The checkpoint's ``state.json``."""
    state = json.loads((checkpoint / "state.json").read_text())
    return state if isinstance(state, dict) else {}


def load_adapter_checkpoint(model: Any, checkpoint: Path) -> tuple[int, list[float]]:
    """Load the checkpoint's adapter into ``model`` (not sharded yet); (the step to continue
    from, the curve so far)."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    set_peft_model_state_dict(model, load_file(str(checkpoint / "adapter_model.safetensors")))
    state = load_state(checkpoint)
    return int(state["step"]), [float(v) for v in state["curve"]]


def load_optimizer_checkpoint(model: Any, optimizer: Any, checkpoint: Path) -> None:
    """Load the checkpoint's optimizer state (sharded like ``model``, if it is)."""
    import torch
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    # map_location: a checkpoint written on a GPU resumes on a CPU too
    saved = torch.load(checkpoint / "optimizer.pt", map_location="cpu", weights_only=True)
    options = StateDictOptions(full_state_dict=True, ignore_frozen_params=True)
    set_optimizer_state_dict(model, optimizer, optim_state_dict=saved, options=options)


def load_checkpoint(model: Any, optimizer: Any, out: Path) -> tuple[int, list[float]]:
    """Load the newest whole checkpoint in ``out`` into an unsharded learner; (the step to
    continue from, the curve so far)."""
    checkpoint = resume_point(out)
    step_curve = load_adapter_checkpoint(model, checkpoint)
    load_optimizer_checkpoint(model, optimizer, checkpoint)
    return step_curve
