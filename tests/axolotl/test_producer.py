"""The data producer's batch: the rollout contract axolotl's async GRPO trainer consumes.

A loopback agent answers with the seed's two-turn Wordle result (and, for some rollouts,
an error); the producer plays the rows through a real ``AgentClient``.

    turn 0  prompt [1 2 3 4 5]                       gen [10 11 12 13]
    turn 1  prompt [1 2 3 4 5 10 11 12 13 50 51 52]  gen [20 21 22]
    completion [10 11 12 13 50 51 52 20 21 22], tool mask [1 1 1 1 0 0 0 1 1 1]
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from nemogym_sdk import AgentClient
from nemogym_sdk.adapters.axolotl import NemoGymSettings, nemo_gym_env_reward
from nemogym_sdk.adapters.axolotl.dataset import build_dataset
from nemogym_sdk.adapters.axolotl.producer import NemoGymDataProducer
from nemogym_sdk.adapters.axolotl.schedule import GroupSchedule
from tests.fakes import agent_server
from tests.test_seed_contract import AGENT_RESPONSE

FAILURE = {"error": "Connection timeout", "response": {"output": []}, "reward": 0.0}
LOW = {**AGENT_RESPONSE, "reward": 0.02}


def _dataset(tmp_path: Path, n: int) -> Any:
    path = tmp_path / "rows.jsonl"
    rows = [
        {"responses_create_params": {"input": [{"role": "user", "content": "Play!"}]}, "seed": i}
        for i in range(n)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return build_dataset(NemoGymSettings.from_cfg({"nemo_gym_datasets": [str(path)]}))


def _producer(client: AgentClient, dataset: Any, rows: int, log: Path) -> NemoGymDataProducer:
    return NemoGymDataProducer(
        client=client,
        dataset=dataset,
        schedule=GroupSchedule(num_rows=len(dataset), rows_per_rank=rows, seed=0),
        num_generations=2,
        config=None,
        eos_token_id=2,
        pad_token_id=0,
        log_path=log,
    )


def test_batch_has_the_rollout_contract(tmp_path: Path) -> None:
    """prompt/completion ids and masks, the sampler's logprobs, the tool mask, the deferred
    inputs carrying env_reward, and the pending-policy-logps marker."""
    dataset = _dataset(tmp_path, 3)
    with (
        agent_server(responses=[AGENT_RESPONSE]) as agent,
        AgentClient({"wordle": agent.url}) as client,
    ):
        producer = _producer(client, dataset, 1, tmp_path / "log.jsonl")
        data = producer.rollout_data(global_step=0)
    assert data["_pending_policy_logps"] is True
    for key in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "tool_mask"):
        assert data[key].shape[0] == 2, key
    assert data["completion_ids"][0].tolist() == [10, 11, 12, 13, 50, 51, 52, 20, 21, 22]
    assert data["completion_mask"][0].tolist() == [1] * 10
    assert data["tool_mask"][0].tolist() == [1, 1, 1, 1, 0, 0, 0, 1, 1, 1]
    logps = data["sampling_per_token_logps"][0].tolist()
    assert logps == pytest.approx([-0.1, -0.2, -0.3, -0.4, 0, 0, 0, -0.5, -0.6, -0.7], abs=1e-6)
    assert data["prompt_ids"][0].tolist() == [1, 2, 3, 4, 5]
    assert int(data["num_items_in_batch"]) == 14  # policy tokens only: 2 x (4 + 3)
    inputs = data["_deferred_inputs"]
    assert [row["env_reward"] for row in inputs] == [0.42, 0.42]
    assert inputs[0]["nemo_gym_row_id"] == inputs[1]["nemo_gym_row_id"]
    assert inputs[0]["nemo_gym_group"] == inputs[1]["nemo_gym_group"]
    assert [row["num_turns"] for row in inputs] == [2, 2]
    assert data["_deferred_completion_ids_list"][0] == [10, 11, 12, 13, 50, 51, 52, 20, 21, 22]
    assert data["_deferred_prompts"][0] == [{"role": "user", "content": "Play!"}]
    (line,) = [json.loads(x) for x in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert line["ok"] == 2 and line["agents"] == {"wordle": 2} and line["turns_mean"] == 2.0


def test_failed_rollout_is_masked_and_keeps_its_groups_baseline(tmp_path: Path) -> None:
    """A failed rollout stays in the batch (length-1, seed contract) with an all-zero tool
    mask (no loss), is not counted in num_items_in_batch, and scores its group's completed
    mean, not 0."""
    dataset = _dataset(tmp_path, 2)
    answers = [AGENT_RESPONSE, FAILURE, LOW, AGENT_RESPONSE]
    with agent_server(responses=answers) as agent, AgentClient({"wordle": agent.url}) as client:
        producer = _producer(client, dataset, 2, tmp_path / "log.jsonl")
        data = producer.rollout_data(global_step=3)
    inputs = data["_deferred_inputs"]
    ok = [row["nemo_gym_ok"] for row in inputs]
    assert ok.count(False) == 1
    bad = ok.index(False)
    assert int(data["completion_mask"][bad].sum()) == 1
    assert int(data["tool_mask"][bad].sum()) == 0
    assert inputs[bad]["nemo_gym_status"] == "agent_error"
    assert int(data["num_items_in_batch"]) == 3 * 7
    rewards = nemo_gym_env_reward(
        data["_deferred_completions"],
        **{k: [row[k] for row in inputs] for k in ("env_reward", "nemo_gym_ok", "nemo_gym_group")},
    )
    partner = bad ^ 1  # the other rollout of the failed one's group (aabb order)
    assert rewards[bad] == pytest.approx(rewards[partner]) and rewards[bad] != 0.0
    line = json.loads((tmp_path / "log.jsonl").read_text())
    assert (line["ok"], line["failures"]) == (3, {"agent_error": 1}) and "first_error" in line


def test_unknown_agent_in_a_row_raises_before_anything_is_sent(tmp_path: Path) -> None:
    from nemogym_sdk import UnknownAgentError

    path = tmp_path / "rows.jsonl"
    path.write_text(
        json.dumps({"responses_create_params": {"input": "x"}, "agent_ref": {"name": "nope"}})
        + "\n"
    )
    dataset = build_dataset(NemoGymSettings.from_cfg({"nemo_gym_datasets": [str(path)]}))
    with agent_server() as agent, AgentClient({"wordle": agent.url}) as client:
        producer = _producer(client, dataset, 1, tmp_path / "log.jsonl")
        with pytest.raises(UnknownAgentError, match="nope"):
            producer.rollout_data(global_step=0)
        assert agent.bodies == []
