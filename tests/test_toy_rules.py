"""The rules and data of the ``target_chars`` toy environment (no NeMo Gym needed).

``rules.py`` runs inside NeMo Gym's Python 3.13 venv as a sibling of the server's
``app.py``; here it is loaded by file path, the way the real-server tests use it to compute
expected rewards independently of the server.
"""

from __future__ import annotations

import json
import random
import re
import statistics
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from nemogym_sdk import load_rows
from nemogym_sdk.gym import SDK_ENVS_DIR

TOY_DIR = SDK_ENVS_DIR / "target_chars"
LOWERCASE = "abcdefghijklmnopqrstuvwxyz"


def load_rules() -> Any:
    """``envs/target_chars/rules.py`` as a module, without writing bytecode next to it."""
    name = "nemogym_sdk_envs_target_chars_rules"
    module = sys.modules.get(name)
    if module is None:
        path = TOY_DIR / "rules.py"
        module = types.ModuleType(name)
        module.__file__ = str(path)
        sys.modules[name] = module  # dataclasses look their module up while decorating
        exec(compile(path.read_text(encoding="utf-8"), str(path), "exec"), module.__dict__)
    return module


rules = load_rules()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", 0.0),
        ("hello", 1.0),
        ("HELLO", 0.0),
        ("Hi!", 1 / 3),
        ("a b", 2 / 3),
        ("I have every", 9 / 12),  # the scripted test backend's reply, cut at 12 tokens
        ("I have everything I need. Done.", 21 / 31),
        ("é", 0.0),  # one code point, not a target
        ("caf\u00e9", 3 / 4),
        ("\ufffd\ufffdab", 2 / 4),  # replacement characters count, and do not score
        ("\n\t", 0.0),
    ],
)
def test_round_reward_is_the_share_of_target_characters(text: str, expected: float) -> None:
    """Characters (code points) in target_chars over all characters; 0.0 for an empty reply."""
    assert rules.round_reward(text, LOWERCASE) == pytest.approx(expected)


def test_round_reward_with_other_target_sets() -> None:
    """Any target set works, non-ASCII included; repeats in the set change nothing."""
    assert rules.round_reward("aeb", "aeiou") == pytest.approx(2 / 3)
    assert rules.round_reward("aeb", "aaeeiioouu") == pytest.approx(2 / 3)
    assert rules.round_reward("ééx", "é") == pytest.approx(2 / 3)
    assert rules.round_reward("", "a") == 0.0


def test_observations_are_short_deterministic_and_name_the_round() -> None:
    """Every observation is < 60 characters (one token per byte), the same on every call."""
    pattern = re.compile(r"Round (\d) of 3\. Word: ([a-z]{4})\. Reply in lowercase letters\.")
    words = set()
    for seed in [*rules.TRAIN_SEEDS, *rules.EXAMPLE_SEEDS]:
        for number in (1, 2, 3):
            text = rules.observation(seed, number, 3)
            match = pattern.fullmatch(text)
            assert match is not None, text
            assert int(match.group(1)) == number
            assert match.group(2) == rules.round_word(seed, number)
            assert len(text.encode()) < 60
            assert text == rules.observation(seed, number, 3, LOWERCASE)
            words.add(match.group(2))
    assert len(words) > 200  # 207 observations, words (almost) all different
    # a golden value: the words must not change with the Python version (SHA-256, not random)
    assert rules.observation(7, 2, 3) == "Round 2 of 3. Word: niip. Reply in lowercase letters."


def test_other_target_sets_shape_the_words_and_the_prompts() -> None:
    """With another target set the words are drawn from it, so copying them still scores 1."""
    task = rules.Task(seed=3, target_chars="xyz", num_rounds=2)
    for number in (1, 2):
        word = rules.round_word(3, number, "xyz")
        assert set(word) <= set("xyz")
        assert task.observation(number).endswith(f"Word: {word}. Reply in the characters xyz.")
        assert rules.round_reward(word, "xyz") == 1.0
    assert rules.system_prompt("xyz") == "Reply with the characters xyz only."
    assert rules.system_prompt(LOWERCASE) == "Reply with lowercase letters only."


def test_an_episode_scores_each_round_and_ends_after_the_last() -> None:
    """Each step returns round_reward / num_rounds and the next observation; the last ends."""
    task = rules.Task.from_row({"seed": 5, "num_rounds": 3})
    episode = rules.GameState(task=task)
    replies = ["abc", "AB", ""]
    results = [episode.step(reply) for reply in replies]
    assert [r.observation for r in results] == [task.observation(2), task.observation(3), None]
    assert [r.terminated for r in results] == [False, False, True]
    assert [r.reward for r in results] == pytest.approx([1 / 3, 0.0, 0.0])
    assert sum(r.reward for r in results) == pytest.approx(
        statistics.mean(rules.round_reward(reply, LOWERCASE) for reply in replies)
    )
    assert results[0].info == {"round": 1, "round_reward": 1.0}
    assert results[-1].info == {"round": 3, "round_reward": 0.0, "round_rewards": [1.0, 0.0, 0.0]}
    with pytest.raises(ValueError, match="ended after 3 rounds"):
        episode.step("more")


def test_task_fields_default_and_are_validated() -> None:
    """target_chars and num_rounds have defaults; a bad field is a ValueError naming it."""
    task = rules.Task.from_row({"seed": 1, "responses_create_params": {}})
    assert (task.seed, task.target_chars, task.num_rounds) == (1, LOWERCASE, 3)
    for row, field in [
        ({}, "seed"),
        ({"seed": "1"}, "seed"),
        ({"seed": True}, "seed"),
        ({"seed": 1, "target_chars": ""}, "target_chars"),
        ({"seed": 1, "target_chars": ["a"]}, "target_chars"),
        ({"seed": 1, "num_rounds": 0}, "num_rounds"),
        ({"seed": 1, "num_rounds": 2.0}, "num_rounds"),
    ]:
        with pytest.raises(ValueError, match=field):
            rules.Task.from_row(row)


def test_generated_rows_are_deterministic_distinct_and_well_formed() -> None:
    """64 train rows and 5 example rows: same every call, all different, each a full task."""
    train, example = rules.train_rows(), rules.example_rows()
    assert train == rules.train_rows() and example == rules.example_rows()
    assert (len(train), len(example)) == (64, 5)
    everything = [json.dumps(row, sort_keys=True) for row in train + example]
    assert len(set(everything)) == 69
    assert {row["seed"] for row in train}.isdisjoint(row["seed"] for row in example)
    for row in train + example:
        assert set(row) == {
            "responses_create_params",
            "seed",
            "target_chars",
            "num_rounds",
            "agent_ref",
        }
        assert row["target_chars"] == LOWERCASE and row["num_rounds"] == 3
        assert row["agent_ref"] == {"type": "responses_api_agents", "name": "target_chars_agent"}
        params = row["responses_create_params"]
        assert params["max_output_tokens"] == 12
        assert [m["role"] for m in params["input"]] == ["system", "user"]
        assert params["input"][0]["content"] == "Reply with lowercase letters only."
        assert all(len(m["content"]) < 60 for m in params["input"])
        assert rules.Task.from_row(row) == rules.Task(seed=row["seed"])


def test_shipped_data_is_what_the_generator_writes(tmp_path: Path) -> None:
    """data/*.jsonl are byte for byte what rules.py generates (regenerate: python rules.py)."""
    shipped = {path.name for path in (TOY_DIR / "data").glob("*.jsonl")}
    assert shipped == {"example.jsonl", "train.jsonl"}
    for name, text in rules.datasets().items():
        assert (TOY_DIR / "data" / name).read_text(encoding="utf-8") == text, name
    rules.write_datasets(tmp_path / "data")
    for name in shipped:
        assert (tmp_path / "data" / name).read_bytes() == (TOY_DIR / "data" / name).read_bytes()


def test_the_sdk_reads_the_shipped_rows() -> None:
    """nemogym_sdk.load_rows reads both files: stable ids, routed to the environment's agent."""
    train = load_rows(TOY_DIR / "data" / "train.jsonl")
    example = load_rows(TOY_DIR / "data" / "example.jsonl")
    assert len(train) == 64 and len(example) == 5
    assert len({row.row_id for row in train + example}) == 69
    assert {row.agent_name for row in train + example} == {"target_chars_agent"}
    assert [dict(row.data) for row in train] == rules.train_rows()


def test_reward_varies_within_groups_under_a_random_policy() -> None:
    """Uniformly random 12-byte replies (decoded as UTF-8 with replacement): every group of 8
    rollouts has a non-zero reward spread, so GRPO gets a signal before any learning."""
    rng = random.Random(0)

    def rollout_reward() -> float:
        replies = [rng.randbytes(12).decode(errors="replace") for _round in range(3)]
        return float(statistics.mean(rules.round_reward(reply, LOWERCASE) for reply in replies))

    groups = [[rollout_reward() for _ in range(8)] for _ in range(50)]
    assert all(statistics.pstdev(group) > 0 for group in groups)
    mean = statistics.mean(r for group in groups for r in group)
    assert 0.05 < mean < 0.3  # far from both ends: room to learn


def test_latency_is_heavy_tailed_capped_and_stalls_as_asked() -> None:
    """A row's ``latency``: Pareto delays from ``scale_s`` up to ``cap_s``, stalls with
    probability ``stall_p``, broken episodes with probability ``error_p``; rows without one answer
    at once; bad fields are refused."""
    import random

    row = {"seed": 0, "latency": {"scale_s": 0.01, "alpha": 1.2, "cap_s": 1.0, "stall_p": 0.1}}
    latency = rules.Task.from_row(row).latency
    assert latency is not None and latency.stall_s == 60.0
    delays = [latency.delay(random.Random(i)) for i in range(2000)]
    ordinary = [d for d in delays if d != 60.0]
    assert 0.05 < (len(delays) - len(ordinary)) / len(delays) < 0.15
    assert min(ordinary) >= 0.01 and max(ordinary) == 1.0  # the cap is reached: a heavy tail
    assert sorted(ordinary)[len(ordinary) // 2] < 0.02  # while the median stays near scale_s
    assert rules.Task.from_row({"seed": 0}).latency is None
    assert not any(latency.breaks(random.Random(i)) for i in range(200))  # error_p 0: never
    flaky = rules.Task.from_row({"seed": 0, "latency": {"error_p": 0.25}}).latency
    assert flaky is not None
    assert 0.15 < sum(flaky.breaks(random.Random(i)) for i in range(2000)) / 2000 < 0.35
    for bad in ({"scale_s": -1}, {"speed": 1}, {"alpha": 0}, {"error_p": 2}, "fast"):
        with pytest.raises(ValueError, match="latency"):
            rules.Task.from_row({"seed": 0, "latency": bad})
