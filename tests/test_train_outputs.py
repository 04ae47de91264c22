"""nemogym-train's outputs without servers: checkpoints round-trip, resumed metrics."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("peft")

from nemogym_sdk.train import build_policy  # noqa: E402
from nemogym_sdk.train_config import TrainConfig  # noqa: E402
from nemogym_sdk.train_outputs import load_checkpoint, open_metrics, save_checkpoint  # noqa: E402


def test_checkpoint_round_trip(tmp_path: Path) -> None:
    """A checkpoint restores the adapter weights, the optimizer state and the curve."""
    config = TrainConfig(lora_rank=4)
    model, _ = build_policy(config)
    optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=0.1)
    loss = sum(p.sum() for p in model.parameters() if p.requires_grad)
    loss.backward()
    optimizer.step()  # lora_B moves off zero; Adam has state
    save_checkpoint(model, optimizer, tmp_path, 3, [0.1, 0.2, 0.3])

    fresh, _ = build_policy(config)
    fresh_optimizer = torch.optim.Adam([p for p in fresh.parameters() if p.requires_grad], lr=0.1)
    step, curve = load_checkpoint(fresh, fresh_optimizer, tmp_path)
    assert (step, curve) == (3, [0.1, 0.2, 0.3])
    trained = {n: p for n, p in model.named_parameters() if p.requires_grad}
    for name, param in fresh.named_parameters():
        if param.requires_grad:
            assert torch.equal(param, trained[name]), name
    assert fresh_optimizer.state_dict()["state"].keys() == optimizer.state_dict()["state"].keys()


def test_resumed_metrics_drop_the_steps_after_the_checkpoint(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"step": s}) + "\n" for s in range(6)))
    with open_metrics(path, 4) as handle:
        handle.write(json.dumps({"step": 4}) + "\n")
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [0, 1, 2, 3, 4]
