"""nemogym-train's checkpoints without servers: round trip, atomic writes, a damaged newest
checkpoint skipped on resume."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("peft")

from nemogym_sdk.errors import ConfigError  # noqa: E402
from nemogym_sdk.train.checkpoints import (  # noqa: E402
    checkpoints,
    load_checkpoint,
    resume_point,
    save_checkpoint,
)
from nemogym_sdk.train.config import TrainConfig  # noqa: E402
from nemogym_sdk.train.recipe import build_policy  # noqa: E402

CONFIG = TrainConfig(lora_rank=4)


def trained() -> tuple[object, object]:
    """A policy whose adapter moved off zero, and an optimizer with state."""
    model, _ = build_policy(CONFIG)
    optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=0.1)
    loss = sum(p.sum() for p in model.parameters() if p.requires_grad)
    loss.backward()
    optimizer.step()
    return model, optimizer


def test_checkpoint_round_trip(tmp_path: Path) -> None:
    """A checkpoint restores the adapter weights, the optimizer state and the curve."""
    model, optimizer = trained()
    save_checkpoint(model, optimizer, tmp_path, 3, [0.1, 0.2, 0.3])

    fresh, _ = build_policy(CONFIG)
    fresh_optimizer = torch.optim.Adam([p for p in fresh.parameters() if p.requires_grad], lr=0.1)
    step, curve = load_checkpoint(fresh, fresh_optimizer, tmp_path)
    assert (step, curve) == (3, [0.1, 0.2, 0.3])
    weights = {n: p for n, p in model.named_parameters() if p.requires_grad}  # type: ignore[attr-defined]
    for name, param in fresh.named_parameters():
        if param.requires_grad:
            assert torch.equal(param, weights[name]), name
    assert fresh_optimizer.state_dict()["state"].keys() == optimizer.state_dict()["state"].keys()  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (lambda p: (p / "state.json").unlink(), "missing state.json"),
        (lambda p: (p / "state.json").write_text('{"step": 4, "cu'), "JSONDecodeError"),
        (lambda p: (p / "adapter_model.safetensors").write_bytes(b"\0" * 16), "adapter"),
        (lambda p: (p / "optimizer.pt").write_bytes(b"PK\3\4 cut"), "optimizer"),
    ],
    ids=["no-state", "cut-state", "bad-adapter", "bad-optimizer"],
)
def test_a_damaged_newest_checkpoint_is_reported_and_skipped(
    tmp_path: Path, damage: object, reason: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Resume falls back to the checkpoint before a damaged one and says why it skipped it;
    with none whole, a ConfigError lists them all."""
    model, optimizer = trained()
    save_checkpoint(model, optimizer, tmp_path, 2, [0.1, 0.2])
    newest = save_checkpoint(model, optimizer, tmp_path, 4, [0.1, 0.2, 0.3, 0.4])
    damage(newest)  # type: ignore[operator]
    assert resume_point(tmp_path).name == "step_000002"
    said = capsys.readouterr().err
    assert "resuming from step_000002" in said and "step_000004" in said
    if reason not in ("adapter", "optimizer"):
        assert reason in said
    damage(tmp_path / "checkpoints" / "step_000002")  # type: ignore[operator]
    with pytest.raises(ConfigError, match="no usable checkpoint") as info:
        resume_point(tmp_path)
    assert "step_000002" in str(info.value) and "step_000004" in str(info.value)


def test_resume_without_a_checkpoint_says_so(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"no checkpoint in .*run without --resume"):
        resume_point(tmp_path)


def test_a_write_that_fails_leaves_nothing_and_names_the_last_good_checkpoint(
    tmp_path: Path,
) -> None:
    """A full disk mid-checkpoint (here a real EFBIG: the process may write 20 kB per file,
    less than the optimizer state): no partial ``step_*`` is left, the error names the
    file system's complaint and the last good checkpoint, and the next resume uses it."""
    script = textwrap.dedent(
        f"""
        import resource, signal, sys
        from pathlib import Path
        import torch
        from nemogym_sdk.train.recipe import build_policy
        from nemogym_sdk.train.checkpoints import save_checkpoint
        from nemogym_sdk.train.config import TrainConfig
        from nemogym_sdk.train.faults import RunStoppedError

        model, _ = build_policy(TrainConfig(lora_rank=4))
        optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad])
        sum(p.sum() for p in model.parameters() if p.requires_grad).backward()
        optimizer.step()
        out = Path({str(tmp_path)!r})
        save_checkpoint(model, optimizer, out, 1, [0.5])
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of a kill
        resource.setrlimit(resource.RLIMIT_FSIZE, (20_000, resource.RLIM_INFINITY))
        try:
            save_checkpoint(model, optimizer, out, 2, [0.5, 0.6])
        except RunStoppedError as exc:
            print(exc)
            sys.exit(3)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 3, done.stderr[-2000:]
    message = done.stdout
    assert "could not write checkpoint" in message and "step_000002" in message
    assert "File too large" in message
    assert f"the last good checkpoint is {tmp_path / 'checkpoints' / 'step_000001'}" in message
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["step_000001"]
    assert [p.name for p in checkpoints(tmp_path)] == ["step_000001"]
    assert resume_point(tmp_path).name == "step_000001"


def test_saving_a_step_again_replaces_it(tmp_path: Path) -> None:
    """A resumed run that fell back past a damaged checkpoint writes that step again."""
    model, optimizer = trained()
    first = save_checkpoint(model, optimizer, tmp_path, 2, [0.1, 0.2])
    (first / "state.json").unlink()
    again = save_checkpoint(model, optimizer, tmp_path, 2, [0.3, 0.4])
    assert again == first and resume_point(tmp_path) == first
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step_000002"]
