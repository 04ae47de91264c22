"""The seed contract: axolotl's 29 NeMo Gym integration cases, ported to nemogym_sdk.

Each test keeps the seed's name (and its class) and asserts the same guarantee through
our API. All 29 pass; none is marked ``xfail``.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from nemogym_sdk import TaskRow, load_rows, normalize_host, parse_agent_response, reward_env
from nemogym_sdk.wire import build_run_body


class TestParseAgentResponse:
    """Tests for parse_agent_response (the seed's _parse_agent_response)."""

    def _parse(self, response: Any, eos_token_id: int = 2) -> dict[str, Any]:
        return parse_agent_response(response, eos_token_id).to_dict()

    def test_empty_response_returns_defaults(self) -> None:
        """An empty dict gives the one-token [eos] rollout with reward 0."""
        result = self._parse({})
        assert result["prompt_ids"] == [2]
        assert result["completion_ids"] == [2]
        assert result["env_mask"] == [0]
        assert result["reward"] == 0.0
        assert result["num_turns"] == 0

    def test_error_response_returns_defaults(self) -> None:
        """An agent error gives the defaults with reward 0."""
        result = self._parse({"error": "something broke"})
        assert result["reward"] == 0.0
        assert result["num_turns"] == 0

    def test_single_turn_function_call(self) -> None:
        """One function-call turn: prompt, generation, mask 1 and logprobs pass through."""
        response = {
            "response": {
                "output": [
                    {
                        "type": "function_call",
                        "name": "guess_word",
                        "arguments": '{"guess": "crane"}',
                        "call_id": "call_1",
                        "prompt_token_ids": [10, 20, 30],
                        "generation_token_ids": [40, 50],
                        "generation_log_probs": [-0.1, -0.2],
                    }
                ]
            },
            "reward": 0.5,
        }
        result = self._parse(response)
        assert result["prompt_ids"] == [10, 20, 30]
        assert result["completion_ids"] == [40, 50]
        assert result["env_mask"] == [1, 1]
        assert result["logprobs"] == [-0.1, -0.2]
        assert result["reward"] == 0.5
        assert result["num_turns"] == 1

    def test_multi_turn_preserves_env_mask(self) -> None:
        """The second turn's new prompt tokens (the tool result) get env_mask 0.

        turn 0  prompt [10 20]                     gen [30 31]
        turn 1  prompt [10 20 30 31 100 101 102]   gen [40 41]
        completion [30 31 100 101 102 40 41], mask [1 1 0 0 0 1 1]
        """
        response = {
            "response": {
                "output": [
                    {
                        "type": "function_call",
                        "prompt_token_ids": [10, 20],
                        "generation_token_ids": [30, 31],
                        "generation_log_probs": [-0.1, -0.2],
                    },
                    {"type": "function_call_output", "output": '{"feedback": "XYGXY"}'},
                    {
                        "type": "function_call",
                        "prompt_token_ids": [10, 20, 30, 31, 100, 101, 102],
                        "generation_token_ids": [40, 41],
                        "generation_log_probs": [-0.3, -0.4],
                    },
                ]
            },
            "reward": 0.3,
        }
        result = self._parse(response)
        assert result["prompt_ids"] == [10, 20]
        assert result["completion_ids"] == [30, 31, 100, 101, 102, 40, 41]
        assert result["env_mask"] == [1, 1, 0, 0, 0, 1, 1]
        assert result["num_turns"] == 2

    def test_empty_output_preserves_reward(self) -> None:
        """An empty output keeps the agent's reward."""
        result = self._parse({"response": {"output": []}, "reward": 0.42})
        assert result["reward"] == 0.42

    def test_message_only_output(self) -> None:
        """A text message with token ids and no function call is one model turn."""
        response = {
            "response": {
                "output": [
                    {
                        "type": "message",
                        "role": "assistant",
                        "content": [{"type": "output_text", "text": "I'll guess crane."}],
                        "prompt_token_ids": [10, 20],
                        "generation_token_ids": [30, 31, 32],
                        "generation_log_probs": [-0.1, -0.2, -0.3],
                    }
                ]
            },
            "reward": 0.1,
        }
        result = self._parse(response)
        assert result["num_turns"] == 1
        assert result["completion_ids"] == [30, 31, 32]
        assert result["env_mask"] == [1, 1, 1]


class TestRewardEnv:
    """Tests for the reward_env pass-through."""

    def test_with_list_rewards(self) -> None:
        """A list of env rewards is returned one per completion."""
        assert reward_env([["comp1"], ["comp2"]], env_reward=[0.5, 0.8]) == [0.5, 0.8]

    def test_with_scalar_reward(self) -> None:
        """A scalar env reward is broadcast to every completion."""
        assert reward_env([["comp1"], ["comp2"]], env_reward=0.7) == [0.7, 0.7]

    def test_missing_reward_returns_zeros(self) -> None:
        """No env reward gives zeros."""
        assert reward_env([["comp1"], ["comp2"]]) == [0.0, 0.0]


class TestRewardNemoGymVerify:
    """reward_nemo_gym_verify against a real resources server on loopback (no mocks)."""

    def test_calls_verify_endpoint(self) -> None:
        """One completion is verified with one /verify call and gets the server's reward."""
        from nemogym_sdk import reward_nemo_gym_verify
        from tests.fakes import resources_server

        with resources_server(reward=0.75) as server:
            result = reward_nemo_gym_verify(
                completions=[[{"role": "assistant", "content": "crane"}]],
                prompts=[[{"role": "user", "content": "Guess a word"}]],
                resources_server_ref=[{"name": "wordle"}],
                verify_extra=[{}],
                servers={"wordle": server.url},
            )
            assert result == [0.75]
            assert server.calls("/verify") == 1

    def test_missing_server_returns_zero(self) -> None:
        """A completion whose resources server is unknown gets 0.0."""
        from nemogym_sdk import reward_nemo_gym_verify

        result = reward_nemo_gym_verify(
            completions=[[{"role": "assistant", "content": "crane"}]],
            prompts=[[{"role": "user", "content": "Guess"}]],
            resources_server_ref=[{"name": "unknown_server"}],
            verify_extra=[{}],
            servers={},
        )
        assert result == [0.0]


class TestNormalizeHost:
    """Tests for normalize_host."""

    def test_zero_addr_normalized(self) -> None:
        """0.0.0.0 becomes the loopback fallback."""
        assert normalize_host("0.0.0.0") == "127.0.0.1"

    def test_localhost_normalized(self) -> None:
        """localhost becomes the loopback fallback."""
        assert normalize_host("localhost") == "127.0.0.1"

    def test_loopback_passthrough(self) -> None:
        """127.0.0.1 passes through."""
        assert normalize_host("127.0.0.1") == "127.0.0.1"

    def test_custom_fallback(self) -> None:
        """A custom fallback replaces the wildcard host."""
        assert normalize_host("0.0.0.0", fallback="10.0.0.1") == "10.0.0.1"

    def test_real_ip_passthrough(self) -> None:
        """A routable address passes through."""
        assert normalize_host("192.168.1.50") == "192.168.1.50"


def _write_rows(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


class TestDatasetLookupKeying:
    """The seed looked rows up by prompt text; we key rows by a stable id instead.

    The guarantee the seed cared about is that the right row, with its ``agent_ref``
    and its whole prompt, reaches the agent. These cases assert that through row ids
    and the ``/run`` body builder.
    """

    def test_single_message_prompt(self, tmp_path: Path) -> None:
        """Rows sharing a one-message prompt stay distinct and keep their own agent_ref.

        Replacement for the seed's check that prompt[0] == prompt[-1] for one message:
        with row ids there is no key to pick, and rows with the same prompt cannot collide.
        """
        prompt = [{"role": "user", "content": "Play Wordle!"}]
        path = _write_rows(
            tmp_path / "rows.jsonl",
            [
                {
                    "responses_create_params": {"input": prompt},
                    "agent_ref": {"name": "a1"},
                    "id": 1,
                },
                {
                    "responses_create_params": {"input": prompt},
                    "agent_ref": {"name": "a2"},
                    "id": 2,
                },
            ],
        )
        rows = load_rows(path)
        assert [row.row_id for row in rows] == [f"{path}:1", f"{path}:2"]
        bodies = [build_run_body(row.data) for row in rows]
        assert [b["agent_ref"]["name"] for b in bodies] == ["a1", "a2"]
        assert [b["id"] for b in bodies] == [1, 2]
        assert all(b["responses_create_params"]["input"] == prompt for b in bodies)

    def test_multi_message_prompt_uses_last(self, tmp_path: Path) -> None:
        """A multi-message prompt reaches the agent whole, with the row's own agent_ref.

        Replacement for the seed's "use prompt[-1] as the lookup key": the body sent to
        /run is the row itself, so the system message and the user message both arrive.
        """
        prompt = [
            {"role": "system", "content": "You are a game player."},
            {"role": "user", "content": "Play Wordle!"},
        ]
        path = _write_rows(
            tmp_path / "rows.jsonl",
            [{"responses_create_params": {"input": prompt}, "agent_ref": {"name": "wordle"}}],
        )
        (row,) = load_rows(path)
        body = build_run_body(row.data)
        assert body["responses_create_params"]["input"] == prompt
        assert body["agent_ref"] == {"name": "wordle"}


def _wordle_rows() -> list[TaskRow]:
    prompt = [{"role": "user", "content": "Play Wordle!"}]
    return [
        TaskRow(
            row_id=f"rows.jsonl:{i}",
            data={
                "responses_create_params": {"input": prompt},
                "agent_ref": {"name": name},
                "target": target,
            },
        )
        for i, (name, target) in enumerate([("wordle_simple_agent", "crane"), ("other", "slide")])
    ]


class TestAgentRefPreservation:
    """agent_ref and the task fields reach the agent through the real client."""

    def test_data_producer_preserves_agent_ref(self) -> None:
        """Rows sharing a prompt each reach their own agent with their own task fields."""
        from nemogym_sdk import AgentClient
        from tests.fakes import agent_server

        with agent_server() as first, agent_server() as second:
            urls = {"wordle_simple_agent": first.url, "other": second.url}
            with AgentClient(urls) as client:
                client.run_sync(_wordle_rows(), eos_token_id=2)
            assert [b["target"] for b in first.bodies] == ["crane"]
            assert [b["agent_ref"]["name"] for b in first.bodies] == ["wordle_simple_agent"]
            assert [b["target"] for b in second.bodies] == ["slide"]

    def test_multi_turn_preserves_agent_ref(self) -> None:
        """The rollout of each row is tagged with its row id and the agent that played it."""
        from nemogym_sdk import AgentClient
        from tests.fakes import agent_server

        with agent_server() as first, agent_server() as second:
            urls = {"wordle_simple_agent": first.url, "other": second.url}
            with AgentClient(urls) as client:
                rollouts = client.run_sync(_wordle_rows(), eos_token_id=2)
        assert [r.agent_name for r in rollouts] == ["wordle_simple_agent", "other"]
        assert [r.row_id for r in rollouts] == ["rows.jsonl:0", "rows.jsonl:1"]


class TestCallAgentsRouting:
    """Routing rows to agent servers by agent_ref.name."""

    def test_routes_to_correct_agent(self) -> None:
        """A row with agent_ref goes to the agent of that name and nowhere else."""
        from nemogym_sdk import AgentClient
        from tests.fakes import agent_server

        row = TaskRow(
            row_id="r:1",
            data={
                "agent_ref": {"name": "wordle_agent"},
                "responses_create_params": {"input": [{"role": "user", "content": "Play"}]},
            },
        )
        with agent_server() as wordle, agent_server() as math:
            urls = {"wordle_agent": wordle.url, "math_agent": math.url}
            with AgentClient(urls) as client:
                client.run_sync([row], eos_token_id=2)
            assert len(wordle.bodies) == 1
            assert math.bodies == []

    def test_fallback_to_first_agent(self) -> None:
        """A row without agent_ref goes to the default agent (the only one deployed)."""
        from nemogym_sdk import AgentClient
        from tests.fakes import agent_server

        row = TaskRow(
            row_id="r:1",
            data={"responses_create_params": {"input": [{"role": "user", "content": "Hello"}]}},
        )
        with agent_server() as only:
            with AgentClient({"default_agent": only.url}) as client:
                (rollout,) = client.run_sync([row], eos_token_id=2)
            assert len(only.bodies) == 1
            assert rollout.agent_name == "default_agent"


class TestPluginDefaults:
    """The axolotl plugin forces dataloader_num_workers to 0."""

    def test_dataloader_num_workers_forced_to_zero(self) -> None:
        """A configured worker count is overridden to 0."""
        from nemogym_sdk.adapters.axolotl import NemoGymPlugin

        cfg = SimpleNamespace(dataloader_num_workers=4, nemo_gym_multi_turn=True)
        NemoGymPlugin().apply_config_defaults(cfg)
        assert cfg.dataloader_num_workers == 0

    def test_dataloader_num_workers_none_stays_zero(self) -> None:
        """An unset worker count becomes 0."""
        from nemogym_sdk.adapters.axolotl import NemoGymPlugin

        cfg = SimpleNamespace(dataloader_num_workers=None)
        NemoGymPlugin().apply_config_defaults(cfg)
        assert cfg.dataloader_num_workers == 0


AGENT_RESPONSE: dict[str, Any] = {
    "response": {
        "output": [
            {
                "type": "function_call",
                "name": "guess_word",
                "arguments": '{"guess": "crane"}',
                "call_id": "call_1",
                "id": "call_1",
                "status": "completed",
                "prompt_token_ids": [1, 2, 3, 4, 5],
                "generation_token_ids": [10, 11, 12, 13],
                "generation_log_probs": [-0.1, -0.2, -0.3, -0.4],
            },
            {
                "type": "function_call_output",
                "call_id": "call_1",
                "output": '{"feedback":"XYGXY","guesses_remaining":5,"done":false}',
            },
            {
                "type": "function_call",
                "name": "guess_word",
                "arguments": '{"guess": "slide"}',
                "call_id": "call_2",
                "id": "call_2",
                "status": "completed",
                "prompt_token_ids": [1, 2, 3, 4, 5, 10, 11, 12, 13, 50, 51, 52],
                "generation_token_ids": [20, 21, 22],
                "generation_log_probs": [-0.5, -0.6, -0.7],
            },
        ],
    },
    "reward": 0.42,
}


class TestNemoGymE2E:
    """Rows -> agent over real HTTP -> parse -> collate -> tensors -> rewards.

    The seed drove axolotl's data producer with a mocked ``_call_agents``; ours drives
    ``AgentClient`` against a loopback agent server that answers with the seed's
    two-turn Wordle result, then ``collate`` and ``Batch.to_torch``.
    """

    def test_produce_returns_valid_rollout_dataset(self) -> None:
        """Two rollouts of one row give padded tensors with the right mask and logprobs."""
        from nemogym_sdk import AgentClient, collate
        from tests.fakes import agent_server

        row = TaskRow(
            row_id="r:1",
            data={"responses_create_params": {"input": [{"role": "user", "content": "Play!"}]}},
        )
        with (
            agent_server(responses=[AGENT_RESPONSE]) as agent,
            AgentClient({"wordle_agent": agent.url}) as client,
        ):
            rollouts = client.run_sync([row], eos_token_id=2, num_generations=2)
        data = collate(rollouts, pad_token_id=0).to_torch("cpu")
        for key in ("prompt_ids", "completion_ids", "completion_mask", "logprobs", "env_mask"):
            assert data[key].shape[0] == 2
        comp_len = int(data["completion_mask"][0].sum().item())
        assert comp_len == 10
        assert data["env_mask"][0][:comp_len].tolist() == [1, 1, 1, 1, 0, 0, 0, 1, 1, 1]
        logps = data["logprobs"][0][:comp_len].tolist()
        assert logps[:4] == pytest.approx([-0.1, -0.2, -0.3, -0.4], abs=1e-6)
        assert logps[4:7] == pytest.approx([0.0, 0.0, 0.0], abs=1e-6)
        assert logps[7:10] == pytest.approx([-0.5, -0.6, -0.7], abs=1e-6)
        assert data["rewards"].tolist() == pytest.approx([0.42, 0.42])
        assert data["ok"].tolist() == [True, True]

    def test_produce_handles_failed_agent_response(self) -> None:
        """A failed rollout stays in the batch as a length-1 sample with reward 0."""
        from nemogym_sdk import AgentClient, collate
        from tests.fakes import agent_server

        failure = {"error": "Connection timeout", "response": {"output": []}, "reward": 0.0}
        row = TaskRow(
            row_id="r:1",
            data={"responses_create_params": {"input": [{"role": "user", "content": "Play!"}]}},
        )
        with (
            agent_server(responses=[AGENT_RESPONSE, failure]) as agent,
            AgentClient({"wordle_agent": agent.url}) as client,
        ):
            rollouts = client.run_sync([row], eos_token_id=2, num_generations=2)
        data = collate(rollouts, pad_token_id=0).to_torch("cpu")
        assert data["completion_ids"].shape[0] == 2
        assert int(data["completion_mask"][0].sum()) == 10
        assert int(data["completion_mask"][1].sum()) == 1
        assert data["rewards"].tolist() == pytest.approx([0.42, 0.0])
        assert data["ok"].tolist() == [True, False]

    def test_reward_functions_chain(self) -> None:
        """reward_env and reward_nemo_gym_verify combine in a multi-reward setup."""
        from nemogym_sdk import reward_nemo_gym_verify
        from tests.fakes import resources_server

        completions = [[{"role": "assistant", "content": "crane"}]]
        prompts = [[{"role": "user", "content": "Guess"}]]
        env_result = reward_env(completions, prompts, env_reward=[0.42])
        assert env_result == [0.42]
        with resources_server(reward=0.75) as server:
            verify_result = reward_nemo_gym_verify(
                completions,
                prompts,
                resources_server_ref=[{"name": "wordle"}],
                verify_extra=[{}],
                servers={"wordle": server.url},
            )
        assert verify_result == [0.75]
        combined = [e + v for e, v in zip(env_result, verify_result, strict=True)]
        assert combined == pytest.approx([1.17])


class TestLoRASyncSetup:
    """LoRA sync delegation to the trainer and probing without a client."""

    def test_delegates_to_async_trainer(self) -> None:
        """When the trainer has its own adapter sync, the installed hook delegates to it
        (once, and not to the original), on the instance only."""
        from nemogym_sdk.lora import install_lora_sync

        calls: list[str] = []
        trainer = SimpleNamespace(
            _sync_lora_adapter=lambda: calls.append("synced"),
            vllm_generation=SimpleNamespace(sync_weights=lambda: calls.append("base")),
        )
        hook = install_lora_sync(trainer)
        trainer.vllm_generation.sync_weights()
        assert calls == ["synced"]
        hook.remove()
        trainer.vllm_generation.sync_weights()
        assert calls == ["synced", "base"]

    def test_check_lora_endpoint_skips_non_main_rank(self) -> None:
        """Probing a generation object without a vLLM client (rank > 0) does not raise."""
        from unittest.mock import MagicMock

        from nemogym_sdk.lora import probe_lora_support

        assert probe_lora_support(SimpleNamespace()) is None
        assert probe_lora_support(MagicMock(spec=[])) is None
