"""The data producer's batch: the rollout contract axolotl's async GRPO trainer consumes.

A loopback agent answers with the seed's two-turn Wordle result (and, for some rollouts,
an error); the producer plays the rows through a real ``AgentClient``.

    turn 0  prompt [1 2 3 4 5]                       gen [10 11 12 13]
    turn 1  prompt [1 2 3 4 5 10 11 12 13 50 51 52]  gen [20 21 22]
    completion [10 11 12 13 50 51 52 20 21 22], tool mask [1 1 1 1 0 0 0 1 1 1]
"""

from __future__ import annotations

import concurrent.futures
import copy
import json
import time
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from nemogym_sdk import AgentClient
from nemogym_sdk.adapters.axolotl import NemoGymSettings, nemo_gym_env_reward
from nemogym_sdk.adapters.axolotl.dataset import build_dataset
from nemogym_sdk.adapters.axolotl.producer import VERSION_COLUMN, NemoGymDataProducer, Pacing
from nemogym_sdk.adapters.axolotl.schedule import GroupSchedule
from nemogym_sdk.wire import ROUTED_EXPERTS, policy_version_envelope
from tests.fakes import FakeServer, agent_server, serve
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


class VersionedAgent:
    """``/run`` answers the seed's two-turn result, each turn tagged with the adapter version
    the sampler serves now (``version``, moved by the test as a trainer's syncs would)."""

    def __init__(self) -> None:
        self.version = 0

    def answer(self) -> dict[str, Any]:
        answer = copy.deepcopy(AGENT_RESPONSE)
        for item in answer["response"]["output"]:
            if item.get("generation_token_ids"):
                item[ROUTED_EXPERTS] = policy_version_envelope(self.version)
        return answer

    def routes(self, server: FakeServer) -> list[web.RouteDef]:
        async def run(request: web.Request) -> web.Response:
            server.record(request, await request.json())
            return web.json_response(self.answer())

        return [web.post("/run", run)]


def _paced(client: AgentClient, dataset: Any, log: Path, staleness: int) -> NemoGymDataProducer:
    return NemoGymDataProducer(
        client=client,
        dataset=dataset,
        schedule=GroupSchedule(num_rows=len(dataset), rows_per_rank=1, seed=0),
        num_generations=2,
        config=None,
        eos_token_id=2,
        pad_token_id=0,
        log_path=log,
        pacing=Pacing(max_staleness=staleness, episode_timeout=30, publish_timeout=30),
    )


def test_paced_producer_hands_out_engine_groups_with_their_staleness(tmp_path: Path) -> None:
    """``nemo_gym_max_staleness: 1``: the engine plays a batch ahead, so the second and later
    batches were sampled by the version before the learner's; every batch's log line says
    so (the staleness of its 14 policy tokens), never more than one version behind, and
    each rollout's record carries the version that sampled it."""
    dataset = _dataset(tmp_path, 3)
    sampler = VersionedAgent()
    log = tmp_path / "log.jsonl"
    with serve(sampler.routes) as agent, AgentClient({"wordle": agent.url}) as client:
        producer = _paced(client, dataset, log, staleness=1)
        versions = []
        try:
            for step in range(4):
                data = producer.rollout_data(global_step=10 + step)  # a resumed run: step 10
                versions.append([row[VERSION_COLUMN] for row in data["_deferred_inputs"]])
                sampler.version = step + 1  # the trainer's LoraSyncCallback, after the step
                producer.published(step + 1)
        finally:
            producer.close()
    lines = [json.loads(x) for x in log.read_text().splitlines()]
    assert [line["step"] for line in lines] == [10, 11, 12, 13]
    staleness = [line["staleness"] for line in lines]
    assert staleness[0] == {"0": 14}
    assert all(set(s) <= {"0", "1"} and sum(s.values()) == 14 for s in staleness)
    assert any("1" in s for s in staleness[1:])
    for step, (line, used) in enumerate(zip(lines, versions, strict=True)):
        assert line["unversioned_tokens"] == 0 and line["engine_group_age_max"] <= 1
        assert all(step - 1 <= v <= step for v in used), (step, used)
    assert len(agent.bodies) >= 8  # every batch played, and the engine ran ahead


def test_paced_producer_waits_for_the_next_version_and_close_ends_the_wait(
    tmp_path: Path,
) -> None:
    """``nemo_gym_max_staleness: 0`` with axolotl's background prefetch: the next batch's
    produce waits until the callback publishes the version that trains it (it does not
    play ahead of the bound), and closing the producer at the end of training ends a wait
    with ``EngineClosedError`` instead of leaving a thread blocked."""
    from nemogym_sdk import EngineClosedError

    dataset = _dataset(tmp_path, 3)
    sampler = VersionedAgent()
    with serve(sampler.routes) as agent, AgentClient({"wordle": agent.url}) as client:
        producer = _paced(client, dataset, tmp_path / "log.jsonl", staleness=0)
        producer.rollout_data(global_step=0)
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            ahead = pool.submit(producer.rollout_data, 1)
            time.sleep(0.5)
            assert not ahead.done() and len(agent.bodies) == 2  # nothing played ahead
            sampler.version = 1
            producer.published(1)
            data = ahead.result(timeout=30)
            assert {row[VERSION_COLUMN] for row in data["_deferred_inputs"]} == {1}
            waiting = pool.submit(producer.rollout_data, 2)
            time.sleep(0.3)
            producer.close()
            with pytest.raises(EngineClosedError):
                waiting.result(timeout=30)


def test_each_scored_batch_brings_its_rollout_metrics_to_the_trainers_log(
    tmp_path: Path,
) -> None:
    """Two batches produced ahead (as with background prefetch), then scored in order: on
    each ``on_rollouts_scored`` the plugin moves that batch's metrics (``nemo_gym/*``, the
    numbers of its ``rollouts.jsonl`` line) into the trainer's metrics, which TRL's ``log``
    averages and reports to every ``report_to``; NaN (no OK rollout) stays out."""
    from collections import defaultdict
    from types import SimpleNamespace

    from nemogym_sdk.adapters.axolotl import NemoGymPlugin

    dataset = _dataset(tmp_path, 2)
    answers = [AGENT_RESPONSE, AGENT_RESPONSE, AGENT_RESPONSE, FAILURE, FAILURE, FAILURE]
    with agent_server(responses=answers) as agent, AgentClient({"wordle": agent.url}) as client:
        producer = _producer(client, dataset, 1, tmp_path / "log.jsonl")
        for step in range(3):
            producer.rollout_data(global_step=step)
    plugin = NemoGymPlugin()
    plugin.producer = producer
    trainer = SimpleNamespace(_metrics={"train": defaultdict(list), "eval": defaultdict(list)})
    store = trainer._metrics["train"]
    plugin.on_rollouts_scored({}, trainer, [], [], {}, [])
    assert store["nemo_gym/ok_fraction"] == [1.0] and "nemo_gym/failures/agent_error" not in store
    for _ in range(3):  # the third call finds nothing left
        plugin.on_rollouts_scored({}, trainer, [], [], {}, [])
    lines = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert store["nemo_gym/ok_fraction"] == [line["ok_fraction"] for line in lines] == [1, 0.5, 0]
    assert store["nemo_gym/failures/agent_error"] == [1.0, 2.0]
    assert store["nemo_gym/turns_mean"] == [line["turns_mean"] for line in lines]
    assert len(store["nemo_gym/reward_mean"]) == 2  # the last batch's is NaN: left out
    assert not trainer._metrics["eval"]
