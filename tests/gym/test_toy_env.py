"""The SDK's own toy environment, ``target_chars``, found by name and played for real.

Without NeMo Gym: ``GymStack`` and the catalogue find the environment in
``nemogym_sdk/gym/envs`` and resolve its datasets there, and a NeMo Gym environment of the
same name is refused. With NeMo Gym (``gym`` mark): two stacks, one in manual mode and one
with the head server (discovered through ``ServerDirectory.from_head``), play the example
rows through ``AgentClient`` against the scripted backend, and every rollout is checked
against ``rules.py``, computed here independently of the server: one model turn per round,
each round's observation in the environment tokens before that turn, the reward the mean
round reward of the decoded replies. Nothing may be written into the venv or the SDK.
"""

from __future__ import annotations

import os
import re
import statistics
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import pytest

from nemogym_sdk import (
    AgentClient,
    ParseOptions,
    RawRun,
    Rollout,
    RolloutStatus,
    ServerDirectory,
    Timeouts,
    load_rows,
)
from nemogym_sdk.errors import ConfigError
from nemogym_sdk.gym import (
    SDK_ENVIRONMENTS,
    SDK_ENVS_DIR,
    GymStack,
    GymVenv,
    PolicyModel,
    build_stack_config,
    describe_environment,
    locate_environment,
)
from nemogym_sdk.gym.locate import sdk_environment_names

from ..test_toy_rules import load_rules
from .fakes import TOY_CONFIG, counting_ports, make_venv
from .stacks import StackFactory, head_url

ENV = "target_chars"
TOY_DIR = SDK_ENVS_DIR / ENV
EOS = 258  # <|im_end|> of the tiny tokenizer the scripted server uses
MODEL = PolicyModel(base_url="http://127.0.0.1:1/v1", model="m")
rules = load_rules()


# ------------------------------------------------------------------ without NeMo Gym


def test_sdk_environments_are_the_envs_directories() -> None:
    """SDK_ENVIRONMENTS lists exactly the directories under envs/, each laid out like a
    NeMo Gym resources server."""
    assert SDK_ENVIRONMENTS == sdk_environment_names() == (ENV,)
    for name in SDK_ENVIRONMENTS:
        directory = SDK_ENVS_DIR / name
        for part in ("app.py", "README.md", "requirements.txt", f"configs/{name}.yaml"):
            assert (directory / part).is_file(), part
        assert (directory / "data" / "example.jsonl").is_file()


def test_stack_config_finds_the_sdk_environment(tmp_path: Path) -> None:
    """The config comes from the SDK's directory, datasets resolve against the directory
    holding nemogym_sdk, and the agent is NeMo Gym's gymnasium_agent with max_steps 3."""
    venv = make_venv(tmp_path / "venv")
    location = locate_environment(venv, ENV)
    assert location.shipped_with_sdk and location.directory == TOY_DIR
    assert location.root == SDK_ENVS_DIR.parents[2]
    assert not locate_environment(venv, "toy").shipped_with_sdk
    stack = build_stack_config(venv, [ENV, "toy"], MODEL, allocate_ports=counting_ports())
    setup, toy = stack.environments
    assert setup.config_path == TOY_DIR / "configs" / f"{ENV}.yaml"
    assert setup.example_path == TOY_DIR / "data" / "example.jsonl"
    assert setup.train_path == TOY_DIR / "data" / "train.jsonl"
    assert (setup.agents, setup.agent_impls) == (("target_chars_agent",), ("gymnasium_agent",))
    assert setup.resources_servers == (ENV,)
    assert setup.dropped == ("target_chars_environment_server",)  # the legacy_agent relay
    assert toy.train_path is None
    agent = stack.global_config["target_chars_agent"]["responses_api_agents"]["gymnasium_agent"]
    assert agent["max_steps"] == 3 == rules.DEFAULT_NUM_ROUNDS
    assert stack.server(ENV).environment == ENV


def test_describe_the_sdk_environment(tmp_path: Path) -> None:
    """describe_environment reads the SDK's config and rows like a NeMo Gym environment's."""
    info = describe_environment(make_venv(tmp_path / "venv"), ENV)
    assert info.shipped_with_sdk
    assert info.agent_impls == ("gymnasium_agent",) and info.max_steps == (3,)
    assert info.num_examples == 5 and info.tools == ()
    assert info.row_keys == ("seed", "target_chars", "num_rounds", "agent_ref")
    assert info.train_path == TOY_DIR / "data" / "train.jsonl"
    assert info.description and info.config_path == TOY_DIR / "configs" / f"{ENV}.yaml"


def test_a_name_in_both_the_sdk_and_the_venv_is_refused(tmp_path: Path) -> None:
    """An SDK environment must not share its name with a NeMo Gym one."""
    venv = make_venv(tmp_path / "venv", {ENV: TOY_CONFIG})
    with pytest.raises(ConfigError, match=r"exists both in nemogym_sdk .* and in the NeMo Gym"):
        locate_environment(venv, ENV)
    with pytest.raises(ConfigError, match="both"):
        build_stack_config(venv, [ENV], MODEL, allocate_ports=counting_ports())
    with pytest.raises(ConfigError, match="both"):
        GymStack([ENV], MODEL, venv=venv, workdir=tmp_path / "w").start()
    for bad in ("", "../target_chars", "a/b", "__pycache__"):
        with pytest.raises(ConfigError, match="not an environment name"):
            locate_environment(venv, bad)


def test_unknown_names_suggest_sdk_environments(tmp_path: Path) -> None:
    """A misspelt name is answered with the close SDK environment names too."""
    venv = make_venv(tmp_path / "venv")
    with pytest.raises(ConfigError, match="did you mean 'target_chars'"):
        build_stack_config(venv, ["target_char"], MODEL, allocate_ports=counting_ports())


# --------------------------------------------------------------------- real NeMo Gym

Snapshot = dict[str, tuple[int, int]]


def _snapshot(*roots: Path) -> Snapshot:
    """Every file and directory under ``roots``: path -> (size, mtime_ns)."""
    found: Snapshot = {}
    for root in roots:
        for directory, dirnames, filenames in os.walk(root):
            for name in [*dirnames, *filenames]:
                path = os.path.join(directory, name)
                info = os.lstat(path)
                found[path] = (info.st_size, info.st_mtime_ns)
    return found


@attrs.frozen
class Played:
    """One mode's stack, how the client saw it, and its rollouts."""

    stack: GymStack
    directory: ServerDirectory
    runs: list[tuple[RawRun, Rollout]]


@pytest.fixture(scope="module")
def before(gym_venv: GymVenv) -> Snapshot:
    """The venv and the SDK's environment directory before any stack started."""
    return _snapshot(gym_venv.root, TOY_DIR)


@pytest.fixture(scope="module")
def played(stack_factory: StackFactory, before: Snapshot) -> Iterator[dict[str, Played]]:
    """A manual-mode and a head-server stack of target_chars, each example row played twice.

    ``PYTHONDONTWRITEBYTECODE`` is removed from the test's environment first, so the
    no-writes check below holds because of the stack, not because of the caller.
    """
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv("PYTHONDONTWRITEBYTECODE", raising=False)
        manual = stack_factory([ENV]).start()
        head = stack_factory([ENV], head_server=True).start()
    directories = {
        "manual": manual.directory,
        "head": ServerDirectory.from_head(head_url(head), wait=60),
    }
    result: dict[str, Played] = {}
    for mode, stack in (("manual", manual), ("head", head)):
        rows = load_rows(stack.example_paths[ENV])
        timeouts = Timeouts(request=300.0, total=600.0)
        with AgentClient(directories[mode], timeouts=timeouts) as client:
            raws = client.run_raw_sync(rows, num_generations=2)
        runs = [(raw, raw.rollout(EOS, ParseOptions(on_drift="raise"))) for raw in raws]
        result[mode] = Played(stack=stack, directory=directories[mode], runs=runs)
    yield result


def _spans(rollout: Rollout, value: int) -> list[list[int]]:
    """Maximal runs of completion tokens whose env mask equals ``value``."""
    mask = rollout.env_mask
    edges = np.flatnonzero(np.diff(np.concatenate([[1 - value], mask, [1 - value]]) != 0))
    return [
        rollout.completion_ids[start:stop].tolist()
        for start, stop in zip(edges[::2], edges[1::2], strict=True)
        if mask[start] == value
    ]


def _reply_texts(output: list[dict[str, Any]]) -> list[str]:
    """The text of each model turn, as NeMo Gym reported it (extract_text's rule)."""
    return [
        "".join(part["text"] for part in item["content"] if part.get("type") == "output_text")
        for item in output
        if item.get("generation_token_ids")
    ]


MODES = ["manual", "head"]


@pytest.mark.gym
def test_head_server_discovery_finds_the_stack(played: dict[str, Played]) -> None:
    """ServerDirectory.from_head lists the stack's agent and resources server."""
    head = played["head"]
    assert head.directory.agents == head.stack.directory.agents
    assert list(head.directory.agents) == ["target_chars_agent"]
    assert head.directory.resources_servers == head.stack.directory.resources_servers
    assert head.directory.resources_server_of("target_chars_agent") == ENV


@pytest.mark.gym
@pytest.mark.parametrize("mode", MODES)
def test_every_rollout_is_ok_with_one_turn_per_round(played: dict[str, Played], mode: str) -> None:
    """2 generations x 5 rows, all OK under the raise drift policy, num_rounds model turns."""
    runs = played[mode].runs
    assert len(runs) == 10
    for raw, rollout in runs:
        assert raw.status is RolloutStatus.OK, raw.error
        assert rollout.status is RolloutStatus.OK, rollout.error
        task = rules.Task.from_row(raw.request.row.data)
        assert rollout.num_turns == task.num_rounds == 3
        result = raw.json()
        assert result["terminated"] is True and result["truncated"] is False


@pytest.mark.gym
@pytest.mark.parametrize("mode", MODES)
def test_observations_sit_between_the_model_turns(played: dict[str, Played], mode: str) -> None:
    """The prompt ends with round 1's observation; the k-th environment span of the env
    mask decodes to text holding round k+1's observation."""
    from nemogym_sdk.serve import build_tiny_tokenizer

    tokenizer = build_tiny_tokenizer()
    for raw, rollout in played[mode].runs:
        task = rules.Task.from_row(raw.request.row.data)
        assert task.observation(1) in tokenizer.decode(rollout.prompt_ids.tolist())
        env_spans = [tokenizer.decode(span) for span in _spans(rollout, 0)]
        assert len(env_spans) == task.num_rounds - 1
        for number, span in enumerate(env_spans, start=2):
            observation = task.observation(number)
            assert observation in span
            # nothing else but the chat template's markers (ChatML: <|im_end|>, role names)
            rest = re.sub(r"<\|\w+\|>|\buser\b|\bassistant\b|\s", "", span.replace(observation, ""))
            assert rest == "", span


@pytest.mark.gym
@pytest.mark.parametrize("mode", MODES)
def test_reward_is_the_mean_round_reward_of_the_replies(
    played: dict[str, Played], mode: str
) -> None:
    """The rollout's reward equals mean(round_reward(reply)) over the model turns, with the
    replies decoded from the policy tokens the trainer sees (and equal to NeMo Gym's text)."""
    from nemogym_sdk.serve import build_tiny_tokenizer

    tokenizer = build_tiny_tokenizer()
    for raw, rollout in played[mode].runs:
        task = rules.Task.from_row(raw.request.row.data)
        result = raw.json()
        replies = [tokenizer.decode(span, skip_special_tokens=True) for span in _spans(rollout, 1)]
        assert replies == _reply_texts(result["response"]["output"])
        expected = [rules.round_reward(reply, task.target_chars) for reply in replies]
        assert rollout.reward == pytest.approx(statistics.mean(expected))
        assert rollout.reward == pytest.approx(result["reward"])
        assert result["info"]["round_rewards"] == pytest.approx(expected)
        assert 0.0 <= rollout.reward <= 1.0


@pytest.mark.gym
def test_bad_rows_and_steps_without_reset_are_client_errors(played: dict[str, Played]) -> None:
    """/reset refuses a row with a bad task field (422); /step without /reset is a 409."""
    import requests

    url = played["manual"].stack.directory.resources_url(ENV)
    row = dict(rules.example_rows()[0], seed="one")
    response = requests.post(f"{url}/reset", json=row, timeout=30)
    assert response.status_code == 422 and "seed must be an integer" in response.text
    step = dict(rules.example_rows()[0], response=played["manual"].runs[0][0].json()["response"])
    response = requests.post(f"{url}/step", json=step, timeout=30)
    assert response.status_code == 409 and "POST /reset first" in response.text


@pytest.mark.gym
def test_train_rows_are_valid_nemo_gym_requests(gym_venv: GymVenv) -> None:
    """NeMo Gym's own request model accepts every shipped row's responses_create_params."""
    code = (
        "import json, sys\n"
        "from nemo_gym.openai_utils import NeMoGymResponseCreateParamsNonStreaming as P\n"
        "for path in sys.argv[1:]:\n"
        "    for line in open(path):\n"
        "        P.model_validate(json.loads(line)['responses_create_params'])\n"
        "print('ok')\n"
    )
    paths = [str(TOY_DIR / "data" / name) for name in ("train.jsonl", "example.jsonl")]
    done = subprocess.run(
        [str(gym_venv.python), "-c", code, *paths],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
        check=False,
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


@pytest.mark.gym
def test_nothing_was_written_into_the_venv_or_the_sdk(
    played: dict[str, Played], before: Snapshot, gym_venv: GymVenv
) -> None:
    """After both stacks started and played: the venv and envs/target_chars are unchanged
    (no __pycache__, no results or cache directories); the stacks wrote to their workdirs."""
    after = _snapshot(gym_venv.root, TOY_DIR)
    assert sorted(set(after) - set(before)) == []
    assert sorted(path for path in before if after.get(path) != before[path]) == []
    for item in played.values():
        assert item.stack.config_path.is_file()
        log = item.stack.log_paths[ENV].read_text()
        assert f"cwd={str(TOY_DIR)!r}" in log
