"""Misuse has one rule: a bad value is a ``ConfigError`` that shows the value received; a call
out of order (start twice, use before start or after close) is a ``UsageError``."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest

from nemogym_sdk import (
    AgentClient,
    ConfigError,
    EngineOptions,
    NemoGymError,
    RetryPolicy,
    RolloutEngine,
    TaskRow,
    UsageError,
)
from nemogym_sdk.grpo import PolicyLoss
from nemogym_sdk.gym import GymStack, PolicyModel
from nemogym_sdk.train.config import TrainConfig

MODEL = PolicyModel(base_url="http://127.0.0.1:9", model="policy")
CLIENT = {"agent": "http://127.0.0.1:9"}


@pytest.mark.parametrize(
    ("make", "shown"),
    [
        (lambda: RetryPolicy(base_delay=-0.5), "base_delay=-0.5"),
        (lambda: PolicyLoss(max_completion_length=0), "got 0"),
        (lambda: AgentClient(CLIENT, max_concurrency=0), "got 0 and 128"),
        (lambda: TrainConfig(num_generations=1), "got 1"),
        (lambda: TrainConfig(lr=-1e-3), "lr must be > 0, got -0.001"),
        (lambda: TrainConfig(temperature=0.0), "temperature must be > 0, got 0.0"),
        (lambda: TrainConfig(max_staleness=-2), "max_staleness must be >= 0, got -2"),
        (lambda: TrainConfig(max_inflight=3), "max_inflight=3"),
        (lambda: TrainConfig(episode_timeout=-1.0), "got -1.0"),
        (lambda: EngineOptions(num_generations=True, groups_per_step=1), "got True"),
        (lambda: GymStack("target_chars", MODEL), "got 'target_chars'"),
    ],
    ids=lambda value: value if isinstance(value, str) else "",
)
def test_a_bad_value_is_a_config_error_that_shows_it(make: Callable[[], Any], shown: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(shown)):
        make()


def test_the_trainer_checks_its_engine_settings_through_the_engines_record() -> None:
    """One record, validated once: what ``TrainConfig`` accepts is what the engine gets."""
    config = TrainConfig(mode="async", max_staleness=2, rows_per_step=3, num_generations=4)
    options = config.engine_options()
    assert (options.max_staleness, options.groups_per_step, options.num_generations) == (2, 3, 4)
    assert options.inflight == 3 * 3 * 4


def test_wrong_order_calls_are_usage_errors() -> None:
    rows = [TaskRow(row_id="r0", data={"responses_create_params": {"input": "hi"}})]
    engine = RolloutEngine(
        AgentClient(CLIENT),
        rows,
        EngineOptions(num_generations=2, groups_per_step=1),
        eos_token_id=2,
    )
    with pytest.raises(UsageError, match=r"start\(\) the RolloutEngine first"):
        engine.next_step(timeout=1)
    client = AgentClient(CLIENT)
    client.close()
    with pytest.raises(UsageError, match="is closed"):
        client.run_sync(rows, eos_token_id=2)


def test_usage_error_is_a_runtime_error_of_the_tree() -> None:
    """Callers that caught ``RuntimeError`` before keep working."""
    assert issubclass(UsageError, RuntimeError) and issubclass(UsageError, NemoGymError)
    assert not issubclass(UsageError, ValueError)  # a bad value is a ConfigError
