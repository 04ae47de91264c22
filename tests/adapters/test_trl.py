"""The TRL adapter's parts, one layer at a time (real loopback servers, a stand-in trainer).

The whole adapter inside TRL's real ``GRPOTrainer`` against real NeMo Gym is in
``tests/gym/test_trl.py``.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("trl")

from nemogym_sdk import ConfigError, DataError, TaskRow, load_rows
from nemogym_sdk.adapters.trl import (
    ROW_ID_KEY,
    LoraSyncCallback,
    UnsupportedTRLError,
    check_trl_version,
    make_dataset,
    make_rollout_func,
    make_verify_reward,
    nemo_gym_reward,
    prompt_row_id,
    sampling_from_args,
)
from nemogym_sdk.policy import RetryPolicy
from tests.fakes import agent_server, resources_server
from tests.test_seed_contract import AGENT_RESPONSE

PROMPT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Play!"}]


def rows_file(tmp_path: Path, targets: list[str]) -> list[TaskRow]:
    """Rows that all share one prompt and differ only in their task field."""
    path = tmp_path / "rows.jsonl"
    lines = [{"responses_create_params": {"input": PROMPT}, "target": t} for t in targets]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return load_rows(path)


def trainer(batch: int, *, training: bool = True, **args: Any) -> Any:
    """The attributes of GRPOTrainer that rollout_func reads."""
    settings = {
        "temperature": 0.7,
        "top_p": 0.9,
        "top_k": 0,
        "min_p": None,
        "repetition_penalty": 1.0,
        "generation_kwargs": None,
        "per_device_train_batch_size": batch,
        "steps_per_generation": 1,
        "num_generations": 2,
    }
    return SimpleNamespace(
        args=SimpleNamespace(**(settings | args)),
        model=SimpleNamespace(training=training),
        processing_class=SimpleNamespace(eos_token_id=2),
        max_completion_length=None,
    )


# --- version -----------------------------------------------------------------------------


@pytest.mark.parametrize("version", ["1.6.0", "1.16.0", "1.99.1.dev0"])
def test_supported_trl_versions(version: str) -> None:
    assert check_trl_version(version) >= (1, 6)


@pytest.mark.parametrize("version", ["1.5.1", "0.29.0", "2.0.0", "unknown"])
def test_unsupported_trl_version_names_the_range_and_the_extra(version: str) -> None:
    with pytest.raises(UnsupportedTRLError, match=r"nemogym-sdk\[trl\]"):
        check_trl_version(version)


# --- dataset -----------------------------------------------------------------------------


def test_rows_sharing_a_prompt_stay_distinct_in_the_dataset(tmp_path: Path) -> None:
    rows = rows_file(tmp_path, ["crane", "slide"])
    dataset = make_dataset(rows)
    assert dataset[ROW_ID_KEY] == [row.row_id for row in rows]
    prompts = dataset["prompt"]
    assert [m["content"] for m in prompts[0]] == ["Be brief.", "Play!"]
    assert [prompt_row_id(p) for p in prompts] == [row.row_id for row in rows]


def test_dataset_prompt_from_string_input_and_content_parts() -> None:
    rows = [
        TaskRow(row_id="a", data={"responses_create_params": {"input": "hello"}}),
        TaskRow(
            row_id="b",
            data={
                "responses_create_params": {
                    "input": [
                        {"role": "user", "content": [{"type": "input_text", "text": "hi"}]},
                        {"type": "function_call_output", "output": "{}"},
                    ]
                }
            },
        ),
    ]
    prompts = make_dataset(rows)["prompt"]
    assert prompts[0] == [{"role": "user", "content": "hello", ROW_ID_KEY: "a"}]
    assert prompts[1] == [{"role": "user", "content": "hi", ROW_ID_KEY: "b"}]


def test_dataset_rejects_duplicate_ids_and_empty_input() -> None:
    row = TaskRow(row_id="a", data={"responses_create_params": {"input": "x"}})
    with pytest.raises(ConfigError, match="share the id"):
        make_dataset([row, row])
    with pytest.raises(DataError, match="no message"):
        make_dataset([TaskRow(row_id="b", data={"responses_create_params": {"input": []}})])


def test_a_prompt_without_a_row_id_is_an_error_that_says_how_to_fix_it() -> None:
    with pytest.raises(DataError, match="make_dataset"):
        prompt_row_id([{"role": "user", "content": "Play!"}])
    with pytest.raises(DataError):
        prompt_row_id("Play!")


# --- sampling ----------------------------------------------------------------------------


def test_sampling_comes_from_the_trainer_args() -> None:
    sampling = sampling_from_args(trainer(4).args, max_tokens_per_turn=64)
    assert (sampling.temperature, sampling.top_p, sampling.max_output_tokens) == (0.7, 0.9, 64)


@pytest.mark.parametrize(
    "setting",
    [{"top_k": 50}, {"min_p": 0.1}, {"repetition_penalty": 1.2}, {"generation_kwargs": {"a": 1}}],
)
def test_sampling_the_responses_api_cannot_carry_is_refused(setting: dict[str, Any]) -> None:
    with pytest.raises(ConfigError, match=next(iter(setting))):
        sampling_from_args(trainer(4, **setting).args)


# --- rollout_func ------------------------------------------------------------------------


def test_rollout_func_plays_each_prompt_by_row_id(tmp_path: Path) -> None:
    """Two rows with one prompt, each repeated twice (TRL's order): four /run calls, each
    with its own row's task field and the trainer's sampling; TRL's keys, one per prompt."""
    rows = rows_file(tmp_path, ["crane", "slide"])
    prompts = [p for p in make_dataset(rows)["prompt"] for _ in range(2)]
    with agent_server(responses=[AGENT_RESPONSE]) as agent:
        with make_rollout_func({"wordle": agent.url}, rows) as rollout_func:
            out = rollout_func(prompts, trainer(4))
        assert [b["target"] for b in agent.bodies] == ["crane", "crane", "slide", "slide"]
        params = agent.bodies[0]["responses_create_params"]
        assert (params["temperature"], params["top_p"]) == (0.7, 0.9)
    for key in ("prompt_ids", "completion_ids", "logprobs", "env_mask"):
        assert len(out[key]) == 4
    assert out["completion_ids"][0] == [10, 11, 12, 13, 50, 51, 52, 20, 21, 22]
    assert out["env_mask"][0] == [1, 1, 1, 1, 0, 0, 0, 1, 1, 1]
    assert out["env_reward"] == [0.42] * 4 and out["num_turns"] == [2] * 4
    assert out["status"] == ["ok"] * 4
    assert [r.row_id for r in rollout_func.last_rollouts] == [rows[0].row_id] * 2 + [
        rows[1].row_id
    ] * 2
    assert [r.repeat_index for r in rollout_func.last_rollouts] == [0, 1, 0, 1]


def test_failed_rollouts_are_unscorable_and_untrained(tmp_path: Path) -> None:
    rows = rows_file(tmp_path, ["crane"])
    prompts = list(make_dataset(rows)["prompt"]) * 2
    failure = {"error": "boom", "response": {"output": []}, "reward": 0.0}
    logged: dict[str, float] = {}
    fake = trainer(2)
    fake._log_metric = logged.__setitem__  # TRL's metric log (what log_metric feeds)
    with (
        agent_server(responses=[AGENT_RESPONSE, failure]) as agent,
        make_rollout_func({"wordle": agent.url}, rows) as rollout_func,
    ):
        out = rollout_func(prompts, fake)
    assert out["status"] == ["ok", "agent_error"]
    assert out["env_reward"] == [0.42, None]
    assert out["env_mask"][1] == [0] * len(out["completion_ids"][1])
    assert nemo_gym_reward([[], []], **out) == [0.42, None]
    # the SDK's step metrics reach TRL's log, one rollout of two failed
    assert logged["nemo_gym/ok_fraction"] == 0.5 and logged["nemo_gym/failures/agent_error"] == 1
    assert logged["nemo_gym/reward_mean"] == pytest.approx(0.42)
    assert logged["nemo_gym/degenerate_groups"] == 1.0  # one OK rollout: no baseline


def test_rollout_func_checks_the_count_trl_expects(tmp_path: Path) -> None:
    """TRL trains on per_device_train_batch_size x steps_per_generation completions per
    process; a slice of another size (e.g. each row once) is an error, not a guess."""
    rows = rows_file(tmp_path, ["crane", "slide"])
    prompts = make_dataset(rows)["prompt"]
    with make_rollout_func({"wordle": "http://127.0.0.1:9"}, rows) as rollout_func:
        with pytest.raises(ConfigError, match="expects num_generations completions per prompt"):
            rollout_func(prompts, trainer(4))
        with pytest.raises(ConfigError, match="TRL passed 2 prompts"):
            rollout_func(prompts, trainer(6))
    assert rollout_func.calls == 0


def test_rollout_func_rejects_unknown_rows_forks_and_trl_vllm(tmp_path: Path) -> None:
    rows = rows_file(tmp_path, ["crane"])
    other = [{"role": "user", "content": "x", ROW_ID_KEY: "elsewhere:1"}]
    with (
        make_rollout_func({"wordle": "http://127.0.0.1:9"}, rows) as rollout_func,
        pytest.raises(ConfigError, match="not among the rows"),
    ):
        rollout_func([other], trainer(1))
    with (
        make_rollout_func({"wordle": "http://127.0.0.1:9"}, rows) as rollout_func,
        pytest.raises(ConfigError, match="use_vllm=False"),
    ):
        rollout_func(list(make_dataset(rows)["prompt"]), SimpleNamespace(use_vllm=True))
    with pytest.raises(ConfigError, match="fork"):
        make_rollout_func({"wordle": "http://127.0.0.1:9"}, rows, on_drift="fork")


# --- reward functions --------------------------------------------------------------------


def test_nemo_gym_reward_passes_through_and_logs_statuses() -> None:
    extra: dict[str, list[Any]] = {}
    scores = nemo_gym_reward(
        ["a", "b", "c"],
        env_reward=[0.5, 0.0, None],
        status=["ok", "ok", "timeout"],
        num_turns=[3, 1, 0],
        log_extra=extra.__setitem__,
    )
    assert scores == [0.5, 0.0, None]
    assert extra["nemo_gym_status"] == ["ok", "ok", "timeout"]


def test_nemo_gym_reward_without_the_rollout_func_is_an_error() -> None:
    with pytest.raises(ConfigError, match="rollout_func"):
        nemo_gym_reward(["a"], prompts=[[]])


def test_verify_reward_scores_each_row_once_and_fails_as_none(tmp_path: Path) -> None:
    rows = rows_file(tmp_path, ["crane", "slide"])
    ids = [row.row_id for row in rows]
    with resources_server(reward=0.75) as server:
        reward = make_verify_reward({"wordle": server.url}, rows)
        try:
            scores = reward([[{"role": "assistant", "content": "crane"}]] * 2, **{ROW_ID_KEY: ids})
        finally:
            reward.close()
        assert scores == [0.75, 0.75]
        assert server.calls("/verify") == 2
        verified = [b for b in server.bodies if "response" in b]  # /verify, not /seed_session
        assert sorted(b["target"] for b in verified) == ["crane", "slide"]
        unseeded = make_verify_reward(
            {"wordle": server.url}, rows, seed_session=False, retry=RetryPolicy(max_attempts=1)
        )
        try:
            assert unseeded(["crane"], **{ROW_ID_KEY: ids[:1]}) == [None]  # /verify said 400
        finally:
            unseeded.close()
        assert unseeded.failures == 1


# --- LoRA sync callback --------------------------------------------------------------------


def test_lora_callback_touches_the_server_only_on_the_main_process() -> None:
    callback = LoraSyncCallback(None)
    worker = SimpleNamespace(is_world_process_zero=False, global_step=1)
    callback.on_train_begin(None, worker, None, model=object())
    callback.on_step_end(None, worker, None, model=object())
    assert callback.records == []
    with pytest.raises(ConfigError, match="main process"):
        main = SimpleNamespace(is_world_process_zero=True, global_step=1)
        callback.on_step_end(None, main, None, model=None)
