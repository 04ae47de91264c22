"""How a ``nemogym-train`` run starts its parts side by side: each takes seconds (the
learner's imports and weights, the sampler, NeMo Gym's servers), and started one after
another they add up.

- ``building``: the policy is built on a thread of its own while the servers start;
- ``meanwhile``: a context (NeMo Gym's deployment) entered on a thread of its own while the
  caller starts another (the sampler), and left on the way out whatever happened.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from nemogym_sdk.train.checkpoints import load_adapter_checkpoint
from nemogym_sdk.train.config import TrainConfig
from nemogym_sdk.train.learner import build_model

if TYPE_CHECKING:
    from peft import PeftModel

__all__ = ["building", "meanwhile"]

T = TypeVar("T")


@contextlib.contextmanager
def building(
    config: TrainConfig, device: str, checkpoint: Path | None
) -> Iterator[Callable[[], PeftModel]]:
    """The policy (`build_model`, with ``checkpoint``'s adapter when the run resumes), built
    on a thread of its own while the servers start: its imports and weights take seconds
    that would otherwise come on top of the sampler's and NeMo Gym's start. Calling what
    this yields waits for the model (and raises what building it raised)."""

    def build() -> PeftModel:
        model = build_model(config, device)
        if checkpoint is not None:
            load_adapter_checkpoint(model, checkpoint)
        return model

    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="nemogym-policy") as pool:
        yield pool.submit(build).result


@contextlib.contextmanager
def meanwhile(context: contextlib.AbstractContextManager[T]) -> Iterator[Callable[[], T]]:
    """Enter ``context`` on a thread of its own; calling what this yields waits for what it
    gives (and raises what entering it raised). On the way out, whatever happened meanwhile,
    the entry is waited for and ``context`` is left."""
    entered = contextlib.ExitStack()
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="nemogym-start") as pool:
        future = pool.submit(entered.enter_context, context)
        try:
            yield future.result
        finally:
            concurrent.futures.wait([future])
            entered.close()
