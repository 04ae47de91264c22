"""How ``nemogym-train`` starts its parts side by side: the policy is built on a thread while
the servers start (`building`), and NeMo Gym starts beside the sampler, whose URL is planned
beforehand (`planned_url`, `meanwhile`). The servers' side of it runs in every
trainer test through real NeMo Gym (``tests/gym/test_train*.py``)."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator

import pytest

pytest.importorskip("torch")

from nemogym_sdk.train.config import TrainConfig
from nemogym_sdk.train.sampler import planned_url
from nemogym_sdk.train.startup import building, meanwhile


class Door:
    """A context whose entry takes ``seconds`` on whatever thread enters it."""

    def __init__(self, seconds: float = 0.2, fail: bool = False) -> None:
        self.seconds, self.fail = seconds, fail
        self.events: list[str] = []
        self.entered_on: str | None = None

    @contextlib.contextmanager
    def open(self) -> Iterator[str]:
        self.entered_on = threading.current_thread().name
        time.sleep(self.seconds)
        if self.fail:
            raise RuntimeError("the door is stuck")
        self.events.append("entered")
        try:
            yield "inside"
        finally:
            self.events.append("left")


def test_meanwhile_enters_on_another_thread_and_leaves_on_the_way_out() -> None:
    door = Door(0.3)
    began = time.monotonic()
    with meanwhile(door.open()) as inside:
        assert time.monotonic() - began < 0.2  # the entry did not hold this thread
        assert inside() == "inside" and door.events == ["entered"]
    assert door.events == ["entered", "left"]
    assert door.entered_on is not None and door.entered_on != threading.current_thread().name


def test_meanwhile_raises_what_the_entry_raised_where_it_is_asked_for() -> None:
    with meanwhile(Door(fail=True).open()) as inside, pytest.raises(RuntimeError, match="stuck"):
        inside()


def test_an_error_meanwhile_still_waits_for_the_entry_and_leaves() -> None:
    """The caller failed while the context was being entered: what was entered is left, so
    nothing started meanwhile outlives the run."""
    door = Door(0.3)
    with pytest.raises(ValueError), meanwhile(door.open()):
        raise ValueError("the sampler did not start")
    assert door.events == ["entered", "left"]


@pytest.mark.parametrize(
    "config",
    [TrainConfig(), TrainConfig(backend="vllm"), TrainConfig(replicas=2)],
    ids=["transformers", "vllm", "replicas"],
)
def test_a_started_samplers_url_is_planned_before_it_runs(config: TrainConfig) -> None:
    """The front server (the sampler, or the proxy before vLLM or the replicas) gets a free
    port chosen beforehand, so NeMo Gym can be pointed at it while it starts."""
    url, port = planned_url(config)
    assert port is not None and url == f"http://127.0.0.1:{port}/v1"
    assert planned_url(config)[1] != port  # each run its own


def test_an_attached_samplers_url_is_the_one_given() -> None:
    attached = planned_url(TrainConfig(backend_url="http://127.0.0.1:8000"))
    assert attached == ("http://127.0.0.1:8000/v1", None)


def test_the_policy_is_built_on_a_thread_of_its_own() -> None:
    with building(TrainConfig(lora_rank=4), "cpu", None) as policy:
        model = policy()
    assert model is policy()  # built once
    assert sum(p.numel() for n, p in model.named_parameters() if "lora_" in n) > 0
