"""Seeded rollouts (issue 29: a resumed run replays a group's tokens): the seed of each
rollout (``RolloutRequest.seed``, ``data.rollout_seed``) reaches the model requests of its
episode through ``/run``, from ``AgentClient``, ``RolloutEngine`` and ``nemogym-train``'s
settings (real loopback HTTP, the testing kit's fake agent)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from nemogym_sdk import (
    AgentClient,
    ConfigError,
    EngineOptions,
    RetryPolicy,
    RolloutEngine,
    RolloutRequest,
    TaskRow,
)
from nemogym_sdk.data import rollout_seed
from nemogym_sdk.train.config import TrainConfig
from nemogym_sdk.wire import EPISODE_ID, RESPONSES_CREATE_PARAMS, SAMPLING_SEED
from nemogym_sdk.wire.affinity import EXTRA_BODY, METADATA
from tests.fault_agent import TASK_KEY, fault_agent, fault_row

EOS = 2


def _extra_body(body: dict[str, Any]) -> dict[str, Any]:
    """What NeMo Gym's ``vllm_model`` merges into every chat request of the episode."""
    metadata = body[RESPONSES_CREATE_PARAMS].get(METADATA) or {}
    return dict(json.loads(metadata[EXTRA_BODY])) if EXTRA_BODY in metadata else {}


def _rows(n: int) -> list[TaskRow]:
    return [TaskRow(row_id=f"seeds.jsonl:{i}", data=fault_row(i)) for i in range(n)]


def test_rollout_seed_is_a_stable_hash_of_the_run_the_group_and_the_index() -> None:
    seeds = {(g, i): rollout_seed(0, g, i) for g in range(50) for i in range(8)}
    assert len(set(seeds.values())) == len(seeds)  # no two rollouts of a run share one
    assert all(0 <= s < 2**63 for s in seeds.values())
    assert rollout_seed(0, 3, 1) == seeds[3, 1] != rollout_seed(1, 3, 1)


@pytest.mark.parametrize("seed", [-1, 1.5, True, "7"])
def test_a_bad_rollout_seed_is_a_config_error_naming_it(seed: Any) -> None:
    with pytest.raises(ConfigError, match=repr(seed).replace(".", r"\.")):
        RolloutRequest(row=_rows(1)[0], seed=seed)


def test_a_seeded_rollout_carries_its_seed_and_an_episode_id_to_the_model() -> None:
    """The seed goes with an episode id, even without a sampler to abort at: the id tells
    the sampler that the episode's turns share the seed (``turn_seed``). An unseeded
    rollout carries neither, and nothing is aborted without ``sampler_url``."""
    rows = _rows(3)
    requests = [RolloutRequest(row=rows[0], seed=11), RolloutRequest(row=rows[1], seed=12)]
    with (
        fault_agent({}) as agent,
        AgentClient({"a": agent.url}, retry=RetryPolicy(max_attempts=1)) as client,
    ):
        played = client.run_sync([*requests, RolloutRequest(row=rows[2])], eos_token_id=EOS)
    assert all(r.ok for r in played), [r.error for r in played]
    sent = {r.body[TASK_KEY]: _extra_body(r.body) for r in agent.records()}
    assert sent["t0"][SAMPLING_SEED] == 11 and sent["t1"][SAMPLING_SEED] == 12
    assert sent["t0"][EPISODE_ID] != sent["t1"][EPISODE_ID]
    assert sent["t2"] == {}


def test_the_engine_seeds_each_episode_by_its_group_and_index() -> None:
    """``EngineOptions(seed=...)``: episode ``i`` of group ``n`` samples with
    ``rollout_seed(seed, n, i)``, the same wherever the group is played again."""
    options = EngineOptions(num_generations=2, groups_per_step=3, seed=5)
    with (
        fault_agent({}) as agent,
        AgentClient({"a": agent.url}) as client,
        RolloutEngine(client, _rows(3), options, eos_token_id=EOS) as engine,
    ):
        step = engine.next_step()
    groups = {g.row.row_id: g.index for g in step.groups}
    seeds = sorted(_extra_body(r.body)[SAMPLING_SEED] for r in agent.records())
    expected = sorted(rollout_seed(5, n, i) for n in groups.values() for i in range(2))
    assert seeds == expected


def test_the_trainer_seeds_the_samplers_it_starts_and_those_it_is_told_to() -> None:
    """``nemogym-train`` seeds rollouts when it starts the ``transformers`` sampler (or its
    replicas), or when ``seeded_rollouts`` says the sampler attached to takes seeds; not
    for vLLM on CPU (a per-request seed in a batch crashes vLLM 0.32 there)."""
    assert TrainConfig(seed=3).rollouts_seed == 3
    assert TrainConfig(seed=3, replicas=2).engine_options().seed == 3
    assert TrainConfig(backend="vllm").rollouts_seed is None
    assert TrainConfig(backend_url="http://127.0.0.1:9").rollouts_seed is None
    attached = TrainConfig(backend_url="http://127.0.0.1:9", seeded_rollouts=True, seed=4)
    assert attached.rollouts_seed == 4
