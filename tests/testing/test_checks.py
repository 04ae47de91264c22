"""The kit's checks as a parser author meets them: our parser passes every one, a failure
shrinks to a drawn minimal input (also the input that crashed), declared differences
leave the other checks running, and no deadline comes back with a user's settings."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import attrs
import pytest
from hypothesis import Phase, settings

from nemogym_sdk import ConfigError, DriftPolicy
from nemogym_sdk.testing import (
    CHECKS,
    Episode,
    FailureCase,
    PropertyCheckError,
    check_all,
    check_failures_not_trained,
    check_never_crashes,
    check_num_turns,
    check_reward,
    find_failures,
    sdk_parser,
    seed_dict_samples,
)
from tests.testing.planted import planted
from tests.testing.profiles import QUICK

pytestmark = pytest.mark.property


@pytest.mark.parametrize("name", list(CHECKS))
def test_our_parser_passes_every_check(name: str) -> None:
    """FORK (every drift-free run of turns is trained) passes each check, fed dicts and
    raw bytes."""
    CHECKS[name](sdk_parser(DriftPolicy.FORK), settings=QUICK)


@pytest.mark.parametrize("policy", [DriftPolicy.MARK, DriftPolicy.RAISE])
def test_our_parser_passes_under_the_other_policies(policy: DriftPolicy) -> None:
    """MARK (drifted rollouts are not trainable) and RAISE (DriftError, declared) pass
    the checks the policy touches (the well-formed ones do not drift)."""
    parser = sdk_parser(policy)
    assert find_failures(parser, settings=QUICK, only=["drift_rejected", "never_crashes"]) == {}


def _episode(value: Any) -> Episode:
    return value.episode if isinstance(value, FailureCase) else value


SHRUNK: dict[str, tuple[str, str, Callable[[Any], Any], Any]] = {
    # bug -> (the check, a phrase of its message, the counterexample's shape, the shape)
    "drops_env_tokens": (
        "stitching",
        "does not follow its prompt",
        lambda e: (e.prompts, e.generations),
        (((3,), (3, 3, 3)), ((3,), (3,))),
    ),
    "trains_env_tokens": (
        "env_tokens_not_trained",
        "an environment or prompt token is trained",
        lambda e: (e.prompts, e.generations),
        (((3,), (3, 3, 3)), ((3,), (3,))),
    ),
    "masks_last_token": (
        "policy_tokens_trained",
        "generated tokens are not trained: turn 0 token 0 (3)",
        lambda e: (e.prompts, e.generations),
        (((3,),), ((3,),)),
    ),
    "shifts_logprobs": (
        "logprobs",
        "do not carry their own sampled logprobs",
        lambda e: e.generations,
        ((3,),),
    ),
    "counts_output_items": (
        "num_turns",
        "reports 2 model turns, the episode has 1",
        lambda e: e.num_turns,
        1,
    ),
    "int_reward_read_as_zero": (
        "reward",
        "the sample's reward is 0.0",
        lambda e: (type(e.reward), abs(e.reward)),
        (int, 1),
    ),
    "pads_logprobs": (
        "logprob_count_mismatch_not_trained",
        "a miscounted turn is padded or cut",
        lambda c: (c.turn, _episode(c).num_turns),
        (0, 1),
    ),
    "skips_prefix_check": (
        "drift_rejected[retokenized]",
        "drifting history was stitched",
        lambda e: (e.num_turns, e.drift_kinds),
        (2, ((1, "retokenized"),)),
    ),
    "ignores_mask_sample": (
        "failures_not_trained[mask_sample]",
        "(mask_sample)",
        lambda c: (c.kind, _episode(c).num_turns),
        ("mask_sample", 1),
    ),
}


@pytest.mark.parametrize("bug", list(SHRUNK))
def test_a_failure_shrinks_to_a_drawn_minimal_example(bug: str) -> None:
    """The counterexample is the minimal one (tokens 3, one or two turns) and the message
    draws it turn by turn."""
    name, phrase, shape, expected = SHRUNK[bug]
    with pytest.raises(PropertyCheckError) as info:
        CHECKS[name](planted(bug), settings=QUICK)
    failure = info.value
    assert failure.check == name and failure.parser == f"planted parser ({bug})"
    assert phrase in failure.message, failure.message
    assert shape(failure.counterexample) == expected, failure.message
    assert "turn 0: prompt [" in failure.message


def test_check_all_lists_every_failure_with_the_input_that_crashed() -> None:
    """``check_all`` names each failed check; a crash shows the exception, where it was
    raised and the input (as decoded JSON or as bytes)."""
    with pytest.raises(AssertionError) as info:
        check_all(planted("trusts_input"), settings=QUICK)
    text = str(info.value)
    assert "checks failed for planted parser (trusts_input)" in text
    assert "[never_crashes[dicts]] parsing raised " in text
    assert "(at planted.py:" in text
    assert "input (decoded JSON): " in text
    assert "[never_crashes[bytes]] " in text and "input (raw bytes): " in text
    assert "[stitching]" not in text


def test_never_crashes_shows_the_raw_body_that_crashed() -> None:
    """An unguarded ``json.loads`` fails on a truncated or noisy body: the failure holds
    those bytes and prints them."""
    with pytest.raises(PropertyCheckError) as info:
        check_never_crashes(planted("crashes_on_bytes"), settings=QUICK)
    failure = info.value
    assert failure.check == "never_crashes[bytes]"
    assert isinstance(failure.counterexample, bytes)
    assert f"input (raw bytes): {len(failure.counterexample)} bytes " in failure.message
    assert repr(failure.counterexample) in failure.message
    assert "JSONDecodeError" in failure.message


def test_a_family_runs_each_member_and_names_every_failure() -> None:
    """Two failure shapes broken: the family check raises the first and names the other;
    ``find_failures`` returns both, each with its own counterexample."""
    parser = planted("ignores_agent_error", "ignores_mask_sample")
    with pytest.raises(PropertyCheckError) as info:
        check_failures_not_trained(parser, settings=QUICK)
    assert info.value.check == "failures_not_trained[agent_error]"
    assert "(also failed: failures_not_trained[mask_sample])" in info.value.message
    found = find_failures(parser, settings=QUICK, only=["failures_not_trained"])
    assert list(found) == ["failures_not_trained[agent_error]", "failures_not_trained[mask_sample]"]
    assert [f.counterexample.kind for f in found.values()] == ["agent_error", "mask_sample"]


def test_a_declared_difference_is_left_out_and_listed() -> None:
    """A declared check (or family) is not run, wherever it is called from; ``check_all``
    returns the checks it ran and lists the declared ones when something else fails."""
    why = "our trainer scores episodes itself"
    parser = planted("reward_negated", differences={"reward": why})
    assert check_reward(parser, settings=QUICK) is None
    ran = check_all(parser, settings=QUICK, only=["reward", "num_turns"])
    assert ran == ["num_turns"]
    both = planted("reward_negated", "omits_num_turns", differences={"reward": why})
    with pytest.raises(AssertionError) as info:
        check_all(both, settings=QUICK, only=["reward", "num_turns"])
    assert "1 of 1 checks failed" in str(info.value)
    assert f"not run (declared differences):\n  reward: {why}" in str(info.value)
    family = planted("ignores_mask_sample", differences={"failures_not_trained": "n/a"})
    assert check_all(family, settings=QUICK, only=["failures_not_trained"]) == []


def test_differences_must_name_a_check_and_say_why() -> None:
    """A misspelt check or an empty reason is a ``ConfigError`` naming the problem."""
    with pytest.raises(ConfigError, match="names no check 'rewards'"):
        find_failures(planted(differences={"rewards": "typo"}), settings=QUICK)
    with pytest.raises(ConfigError, match="say why it differs from 'reward'"):
        check_reward(planted(differences={"reward": " "}), settings=QUICK)
    with pytest.raises(ConfigError, match="no check 'stiching'"):
        check_all(planted(), settings=QUICK, only=["stiching"])


def test_check_all_leaves_out_checks_that_do_not_apply() -> None:
    """A parser that takes no bytes is not fed raw bodies."""
    ran = check_all(
        attrs.evolve(planted(), takes_bytes=False), settings=QUICK, only=["never_crashes"]
    )
    assert ran == ["never_crashes[dicts]"]


def test_an_adapter_without_num_turns_is_told_how_to_fix_it() -> None:
    """``Sample.num_turns`` left ``None`` fails ``num_turns`` with the two ways out."""

    def forgetful(output: Any) -> Any:
        return [attrs.evolve(s, num_turns=None) for s in seed_dict_samples(output)]

    with pytest.raises(PropertyCheckError) as info:
        check_num_turns(attrs.evolve(planted(), samples=forgetful), settings=QUICK)
    assert "Sample.num_turns is None" in info.value.message
    assert "Parser(differences={'num_turns': 'why'})" in info.value.message


def test_settings_without_a_deadline_bring_no_deadline_back() -> None:
    """A user's ``settings(max_examples=...)`` inherits Hypothesis's 200 ms deadline from
    the default profile; the kit still runs without one, so a parser slower than that
    (here 0.25 s a call) passes a check it passes."""

    def slow(response: Any) -> Any:
        time.sleep(0.25)
        return planted().parse(response)

    user = settings(settings.get_profile("default"), max_examples=2, phases=[Phase.generate])
    assert user.deadline is not None
    check_reward(attrs.evolve(planted(), parse=slow, takes_bytes=False), settings=user)
