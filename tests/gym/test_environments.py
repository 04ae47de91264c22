"""Every catalogued environment starts for real (manual mode) and serves ``/run``."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import pytest
import requests

from nemogym_sdk.gym import CATALOGUE, GymStack

from .stacks import StackFactory, agent_url

pytestmark = pytest.mark.gym

RUN_TIMEOUT_S = 120


@pytest.fixture(scope="module")
def manual_stack(stack_factory: StackFactory) -> Iterator[GymStack]:
    """Every catalogued environment in one manual-mode stack (no Ray, no head server)."""
    with stack_factory(list(CATALOGUE)) as stack:
        yield stack


def _run(stack: GymStack, environment: str, row: dict[str, Any]) -> requests.Response:
    return requests.post(f"{agent_url(stack, environment)}/run", json=row, timeout=RUN_TIMEOUT_S)


def _model_items(result: dict[str, Any]) -> list[dict[str, Any]]:
    return [item for item in result["response"]["output"] if item.get("generation_token_ids")]


@pytest.mark.parametrize("environment", CATALOGUE)
def test_run_returns_a_nemo_gym_result(manual_stack: GymStack, environment: str) -> None:
    """POST the first shipped example row to /run: a verified result with token ids."""
    row = manual_stack.example_rows(environment)[0]
    response = _run(manual_stack, environment, row)
    assert response.status_code == 200, response.text[:2000]
    result = response.json()
    assert isinstance(result["reward"], (int, float)) and not isinstance(result["reward"], bool)
    assert math.isfinite(result["reward"])
    output = result["response"]["output"]
    assert isinstance(output, list) and output
    model_items = _model_items(result)
    assert model_items, "the training model server attaches token ids to model output"
    for item in model_items:
        assert item["prompt_token_ids"]
        assert len(item["generation_log_probs"]) == len(item["generation_token_ids"])


def test_single_tool_call_reward_follows_its_rule(manual_stack: GymStack) -> None:
    """example_single_tool_call rewards 1.0 exactly when get_weather was called."""
    for row in manual_stack.example_rows("example_single_tool_call")[:2]:
        result = _run(manual_stack, "example_single_tool_call", row).json()
        called = any(
            item.get("type") == "function_call" and item.get("name") == "get_weather"
            for item in result["response"]["output"]
        )
        assert result["reward"] == (1.0 if called else 0.0)


def test_multireward_components_sum_to_reward(manual_stack: GymStack) -> None:
    """example_tool_call_multireward returns three 0/1 components whose sum is the reward."""
    row = manual_stack.example_rows("example_tool_call_multireward")[0]
    result = _run(manual_stack, "example_tool_call_multireward", row).json()
    components = result["reward_components"]
    assert set(components) == {"correctness", "schema_valid", "format"}
    assert all(value in (0.0, 1.0) for value in components.values())
    assert sum(components.values()) == result["reward"]


def test_multi_turn_gymnasium_replays_both_follow_ups(manual_stack: GymStack) -> None:
    """example_multi_turn_gymnasium: 3 model turns, the 2 follow-ups as user items between."""
    row = manual_stack.example_rows("example_multi_turn_gymnasium")[0]
    assert len(row["follow_ups"]) == 2
    result = _run(manual_stack, "example_multi_turn_gymnasium", row).json()
    output = result["response"]["output"]
    users = [item for item in output if item.get("role") == "user"]
    assert [item["content"] for item in users] == row["follow_ups"]
    assert len(_model_items(result)) == 3
    assert result["terminated"] is True
    expected = row["expected_answer"].lower()
    final_text = "".join(
        part.get("text", "")
        for item in output[output.index(users[-1]) + 1 :]
        if item.get("type") == "message"
        for part in item.get("content", [])
        if isinstance(part, dict)
    )
    assert result["reward"] == (1.0 if expected in final_text.lower() else 0.0)


def test_blackjack_reward_is_win_draw_or_loss(manual_stack: GymStack) -> None:
    """blackjack ends with +1, 0 or -1 and reports the hands in info."""
    row = manual_stack.example_rows("blackjack")[0]
    result = _run(manual_stack, "blackjack", row).json()
    assert result["reward"] in (-1.0, 0.0, 1.0)
    assert result["terminated"] or result["truncated"]
    if result["terminated"]:
        assert result["info"]["result"] in ("win", "draw", "loss", "bust")


def test_wordle_runs_on_the_stand_in_word_list(manual_stack: GymStack) -> None:
    """wordle resets on a shipped target (stand-in guesses.txt) and reports its outcome."""
    row = manual_stack.example_rows("wordle")[0]
    result = _run(manual_stack, "wordle", row).json()
    assert result["info"]["game_outcome"] in ("win", "loss", "incomplete")
    assert result["reward"] >= 0.0


def test_unknown_request_field_is_a_422(manual_stack: GymStack) -> None:
    """NeMo Gym validates responses_create_params strictly: an unknown key is HTTP 422."""
    row = manual_stack.example_rows("example_single_tool_call")[0]
    bad = {**row, "responses_create_params": {**row["responses_create_params"], "bogus": 1}}
    response = _run(manual_stack, "example_single_tool_call", bad)
    assert response.status_code == 422
    assert "bogus" in response.text


def test_stack_exposes_urls_logs_and_examples(manual_stack: GymStack) -> None:
    """The directory's agent, resources and model URLs, log files and example rows are all
    reachable; each environment's rows go to its own agent."""
    directory = manual_stack.directory
    assert {manual_stack.environment(e).agent for e in CATALOGUE} == set(directory.agents)
    assert len(directory.resources_servers) == len(CATALOGUE)
    assert list(directory.models) == ["policy_model"]
    assert directory.head_url is None and directory.default_agent is None
    for url in [*directory.agents.values(), *directory.resources_servers.values()]:
        assert url.startswith("http://127.0.0.1:")
        assert requests.get(f"{url}/", timeout=5).json() == {"status": "ok"}
    for name, path in manual_stack.log_paths.items():
        assert path.is_file(), name
    for environment, path in manual_stack.example_paths.items():
        assert path.name == "example.jsonl" and manual_stack.example_rows(environment)
