"""nemogym-train, the reference trainer: GRPO on NeMo Gym environments, in one package.

    python -m nemogym_sdk.train --config run.yaml --steps 40      # or: nemogym-train ...

The recipe itself, read top to bottom, is :mod:`nemogym_sdk.train.recipe`; around it:

- ``config``: ``TrainConfig``, read from a YAML file and flags (``parse_config``);
- ``learner``: the processes (torchrun) and the model; ``sampler``: the backend it samples
  from; ``startup``: the model and the servers started side by side; ``play``: a step's
  rollouts, synchronous or from the ``RolloutEngine``;
- ``outputs`` and ``trackers``: ``metrics.jsonl``, ``--report-to``, the summary and the
  curve; ``checkpoints``: atomic checkpoints and ``--resume``; ``faults``: signals, a lost
  sampler, failed writes.

Importing this package stays light (no torch, no NeMo Gym, no LoRA sync): ``main`` loads
the recipe when it runs, and ``run`` and ``build_policy`` load it on first use.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from nemogym_sdk.train.config import TrainConfig

if TYPE_CHECKING:
    from nemogym_sdk.train.recipe import build_policy, run

__all__ = ["TrainConfig", "build_policy", "main", "run"]

_LAZY = {"build_policy": "nemogym_sdk.train.recipe", "run": "nemogym_sdk.train.recipe"}


def main(argv: Sequence[str] | None = None) -> int:
    """``nemogym-train``: parse ``argv`` (default ``sys.argv[1:]``), train, return the exit
    status (0 done, 1 a run that stopped on an error, 2 a configuration error, 130/143 a
    signal)."""
    # the learner, its torchrun ranks and its CPU samplers share the machine's cores: OpenMP
    # threads that spin while they wait burn the cores the other processes need (an async run
    # on 2 cores: 55 s of CPU against 39 s, the same wall time). Set before torch loads; a
    # value of the user's own wins.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    from nemogym_sdk.train import recipe

    return recipe.main(argv)


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'nemogym_sdk.train' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
