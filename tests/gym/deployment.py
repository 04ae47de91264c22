"""One toy deployment for the trainer runs that only need one (imported by conftest).

``nemogym-train`` starts a sampler and NeMo Gym's servers for every run (about 25 s before
step 0 on 2 cores). Tests that look at what a run learns, logs, checkpoints or reports, and
not at how the trainer starts and stops its servers, attach to this one instead: the
sampler the trainer would start (``nemogym_sdk.serve``, the tiny model, seed 0, sampling
with ``processed_logprobs``) and ``target_chars`` with its head server, started once per
test session (once per xdist worker). Every run publishes its own adapter versions to the
sampler from version 0 (or, resumed, from its checkpoint's), so runs one after another do
not see each other's adapters; runs never overlap on one worker.
"""

from __future__ import annotations

from pathlib import Path

import attrs

from nemogym_sdk.gym import BackendProcess, GymStack
from nemogym_sdk.train.config import TrainConfig
from nemogym_sdk.train.sampler import _version_args

ROOMIEST = TrainConfig(mode="async", max_staleness=2)
"""The run whose sampler the shared one is: it keeps the adapter versions an async run with
``max_staleness`` up to 2 needs (4), which is room for every run that attaches."""


@attrs.frozen
class ToyDeployment:
    """The shared sampler and ``target_chars`` deployment, and the flags that attach to it."""

    sampler: BackendProcess
    stack: GymStack
    train_file: Path

    @property
    def flags(self) -> tuple[str, ...]:
        """``nemogym-train`` flags that attach a run to this deployment."""
        head = self.stack.directory.head_url
        assert head is not None
        return (
            *("--backend-url", self.sampler.base_url),
            *("--head-url", head),
            *("--train-file", str(self.train_file)),
        )


def sampler_args() -> list[str]:
    """The flags ``nemogym-train`` gives the sampler it starts for ``ROOMIEST``
    (``nemogym_sdk.train.sampler``), on the CPU."""
    return ["--device", "cpu", *_version_args(ROOMIEST)]
