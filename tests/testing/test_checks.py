"""The kit's property checks: our parser passes them, and each one fails, with a shrunk
counterexample, on a parser that has the bug it is there to catch."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import settings

from nemogym_sdk import DriftPolicy
from nemogym_sdk.testing import (
    CHECKS,
    Episode,
    FailureCase,
    PropertyCheckError,
    check_all,
    sdk_parser,
)
from tests.testing.profiles import QUICK
from tests.testing.toy_parsers import FLAWS, toy_parser

pytestmark = pytest.mark.property

EOS = 2


@pytest.mark.parametrize("name", list(CHECKS))
def test_our_parser_passes_every_check(name: str) -> None:
    """FORK (every drift-free run of turns is trained) passes each check."""
    CHECKS[name](sdk_parser(DriftPolicy.FORK), settings=QUICK)


@pytest.mark.parametrize("policy", [DriftPolicy.MARK, DriftPolicy.RAISE])
def test_our_parser_passes_under_the_other_policies(policy: DriftPolicy) -> None:
    """MARK (drifted rollouts are not trainable) and RAISE (DriftError, declared) pass."""
    check_all(sdk_parser(policy), settings=settings(QUICK, max_examples=50))


@pytest.mark.parametrize("name", list(CHECKS))
def test_the_correct_toy_parser_passes_every_check(name: str) -> None:
    """The flawless toy parser passes, so each failure below is its flaw's doing."""
    CHECKS[name](toy_parser(None), settings=QUICK)


def _episode(value: Any) -> Episode:
    if isinstance(value, FailureCase):
        return value.episode
    if isinstance(value, tuple):
        return value[0]  # the logprob check's (episode, response, broken turn)
    assert isinstance(value, Episode)
    return value


SHRUNK: dict[str, tuple[str, str, Callable[[Any], Any]]] = {
    # flaw -> (the check that must catch it, a phrase of its message, the shrunk input's shape)
    "drops_env_tokens": (
        "stitching",
        "does not follow its prompt",
        lambda e: (_episode(e).prompts, _episode(e).generations),
    ),
    "pads_logprobs": ("logprobs", "do not carry their own logprobs", lambda e: e[2]),
    "trains_env_tokens": (
        "env_tokens_not_trained",
        "an environment or prompt token is trained",
        lambda e: (_episode(e).prompts, _episode(e).generations),
    ),
    "skips_prefix_check": (
        "drift_rejected",
        "drifting history was stitched",
        lambda e: _episode(e).num_turns,
    ),
    "ignores_mask_sample": ("failures_not_trained", "(mask_sample)", lambda e: e.kind),
    "trusts_input": ("never_crashes", "parsing raised", lambda e: type(e).__name__),
}
SHAPES = {
    "drops_env_tokens": (((3,), (3, 3, 3)), ((3,), (3,))),
    "pads_logprobs": 0,
    "trains_env_tokens": (((3,), (3, 3, 3)), ((3,), (3,))),
    "skips_prefix_check": 2,
    "ignores_mask_sample": "mask_sample",
}


@pytest.mark.parametrize("flaw", FLAWS)
def test_each_check_catches_its_flaw_with_a_shrunk_counterexample(flaw: str) -> None:
    """Each flaw fails its check; the counterexample is the minimal one (tokens 3, one or
    two turns) and the message draws it."""
    name, phrase, shape = SHRUNK[flaw]
    with pytest.raises(PropertyCheckError) as info:
        CHECKS[name](toy_parser(flaw), settings=QUICK)
    failure = info.value
    assert failure.check == name
    assert phrase in failure.message
    assert "toy parser" in str(failure)
    if flaw in SHAPES:
        assert shape(failure.counterexample) == SHAPES[flaw], failure.message
        assert "turn 0: prompt [" in failure.message, failure.message
    else:
        assert shape(failure.counterexample) in {"dict", "list", "NoneType", "str", "int"}


def test_check_all_lists_every_failed_check() -> None:
    """``check_all`` runs every check and names each one that failed."""
    with pytest.raises(AssertionError) as info:
        check_all(toy_parser("trusts_input"), settings=QUICK)
    text = str(info.value)
    assert "checks failed for toy parser (trusts_input)" in text
    assert "[never_crashes] parsing raised" in text
    assert "[stitching]" not in text
