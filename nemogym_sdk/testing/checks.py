"""Ready-made property checks for any NeMo Gym parser (``/run`` result -> training sample).

Point a check at a parser through a ``Parser``: the function to test and an adapter
that turns its output into ``Sample`` records (the default, ``seed_dict_samples``, reads
the seed's dict that axolotl's parser returns; ``rollout_samples`` reads this SDK's
``Rollout``). Each check runs Hypothesis over generated ``/run`` results and raises
``PropertyCheckError`` (an ``AssertionError``) carrying the shrunk counterexample::

    from nemogym_sdk.testing import Parser, check_all

    check_all(Parser(parse=lambda response: my_parse(response, EOS), name="mine"))

Every check tests one property, so one failure cannot hide another: ``check_all`` and
``find_failures`` run each of ``CHECKS`` on its own and report every one that fails.

Ground truth on well-formed episodes, one field of the expected sample each:

- ``stitching``: one trainable sample whose prompt + completion reproduces every turn's
  prompt and generation, token for token.
- ``env_tokens_not_trained``: no tool output, template glue or prompt token is trained.
- ``policy_tokens_trained``: every generated token is trained.
- ``logprobs``: each trained token carries the logprob it was sampled with.
- ``reward``: the sample's reward is the episode's (integer JSON rewards included).
- ``num_turns``: the sample reports the episode's number of model turns.

Inputs that must not be trained as they are:

- ``logprob_count_mismatch_not_trained``: a turn whose logprob count differs from its
  token count (short, long, absent) is never trained: no padding, no cutting.
- ``drift_rejected[retokenized|stripped|rerendered]``: a history that drifted is
  rejected, marked, or split at the drift, never stitched across it.
- ``failures_not_trained[agent_error|empty_output|no_answer|no_token_ids|mask_sample]``:
  each failure shape gives no trainable sample.
- ``never_crashes[dicts]`` and ``never_crashes[bytes]`` (when ``Parser.takes_bytes``):
  malformed input never raises anything but a declared rejection; the failure shows it.

With ``tokenizer=`` (a fast tokenizer with a chat template, e.g. a model family's), the
episode checks draw real conversations instead of small integers (``templated_episodes``):
the well-formed ones through the sampler's contiguous history, ``drift_rejected[kind]``
through the template's own rendering, where each kind of drift happens for its real reason
(``stripped`` needs ``reasoning_parser=``; without one that member draws as before).

A parser that differs from a check on purpose says so in ``Parser.differences`` (check
name, or a family such as ``"failures_not_trained"``, -> why); those checks are left out
and all the others still run. The checks never run under a Hypothesis deadline (a slow
machine must not fail a correctness check), whatever ``settings=`` says.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

import attrs
import hypothesis
from hypothesis import HealthCheck, given
from hypothesis import strategies as st

from nemogym_sdk.errors import ConfigError
from nemogym_sdk.testing import properties
from nemogym_sdk.testing.episodes import DRIFT_KINDS, DriftKind, drifted_episodes, episodes
from nemogym_sdk.testing.parsers import Parser, PropertyCheckError
from nemogym_sdk.testing.responses import (
    FAILURE_KINDS,
    failures,
    json_values,
    mangled_responses,
    raw_responses,
)
from nemogym_sdk.testing.templated import templated_episodes

__all__ = [
    "CHECKS",
    "check_all",
    "check_drift_rejected",
    "check_env_tokens_not_trained",
    "check_failures_not_trained",
    "check_logprob_count_mismatch_not_trained",
    "check_logprobs",
    "check_never_crashes",
    "check_num_turns",
    "check_policy_tokens_trained",
    "check_reward",
    "check_stitching",
    "find_failures",
]

logger = logging.getLogger(__name__)

_NEGATIVE = st.floats(min_value=-30.0, max_value=-1 / 64, allow_nan=False)
"""Logprobs below zero, so a padded 0.0 stands out."""


@attrs.frozen(kw_only=True)
class _Check:
    """One property under Hypothesis."""

    name: str
    """The key in ``CHECKS`` (``family[member]`` for a member of a family)."""
    strategy: st.SearchStrategy[Any]
    body: Callable[[Parser, Any], None]
    share: int = 1
    """The family's size: each member runs ``max_examples // share`` examples (at least
    ``_MIN_EXAMPLES``), so that every member is tried even in a short run (drawn from one
    strategy, Hypothesis favours some kinds and a 100-example run could miss one)."""
    applies: Callable[[Parser], bool] = lambda parser: True
    templated: Callable[[Any, str | None], st.SearchStrategy[Any] | None] | None = None
    """``(tokenizer, reasoning_parser) -> strategy`` of real conversations for this check
    (None, or a None result: the check draws from ``strategy``)."""

    @property
    def family(self) -> str:
        """The name before ``[``."""
        return self.name.split("[", 1)[0]


def _well_formed(name: str, body: Callable[[Parser, Any], None], **options: Any) -> _Check:
    def templated(tokenizer: Any, reasoning_parser: str | None) -> st.SearchStrategy[Any]:
        kept = {k: v for k, v in options.items() if k in ("logprobs", "max_turns")}
        return templated_episodes(
            tokenizer, history="contiguous", reasoning_parser=reasoning_parser, **kept
        )

    strategy = episodes(**({"max_turns": 4} | options))
    return _Check(name=name, strategy=strategy, body=body, templated=templated)


def _drifting(kind: DriftKind) -> Callable[[Any, str | None], st.SearchStrategy[Any] | None]:
    """Conversations rendered by the template in which the first drift is of ``kind``."""

    def templated(tokenizer: Any, reasoning_parser: str | None) -> st.SearchStrategy[Any] | None:
        if kind == "stripped" and reasoning_parser is None:
            return None  # nothing to strip
        drawn = templated_episodes(tokenizer, reasoning_parser=reasoning_parser)
        return drawn.filter(lambda e: bool(e.drift_kinds) and e.drift_kinds[0][1] == kind)

    return templated


_FAILURE_KINDS = tuple(k for k in FAILURE_KINDS if k != "logprob_count_mismatch")
_ALL: tuple[_Check, ...] = (
    _well_formed("stitching", properties.stitching),
    _well_formed("env_tokens_not_trained", properties.env_tokens_not_trained),
    _well_formed("policy_tokens_trained", properties.policy_tokens_trained),
    _well_formed("logprobs", properties.logprobs, logprobs=_NEGATIVE),
    _well_formed("reward", properties.reward, max_turns=3),
    _well_formed("num_turns", properties.num_turns),
    _Check(
        name="logprob_count_mismatch_not_trained",
        strategy=failures(kinds=("logprob_count_mismatch",)),
        body=properties.logprob_count_mismatch_not_trained,
    ),
    *(
        _Check(
            name=f"drift_rejected[{kind}]",
            strategy=drifted_episodes(drift_kinds=(kind,)),
            body=properties.drift_rejected,
            share=len(DRIFT_KINDS),
            templated=_drifting(kind),
        )
        for kind in DRIFT_KINDS
    ),
    *(
        _Check(
            name=f"failures_not_trained[{kind}]",
            strategy=failures(kinds=(kind,)),
            body=properties.failures_not_trained,
            share=len(_FAILURE_KINDS),
        )
        for kind in _FAILURE_KINDS
    ),
    _Check(
        name="never_crashes[dicts]",
        strategy=mangled_responses() | json_values(),
        body=properties.never_crashes,
    ),
    _Check(
        name="never_crashes[bytes]",
        strategy=raw_responses(),
        body=properties.never_crashes_bytes,
        applies=lambda parser: parser.takes_bytes,
    ),
)
_BY_NAME = {check.name: check for check in _ALL}
_FAMILIES: dict[str, tuple[str, ...]] = {
    family: tuple(check.name for check in _ALL if check.family == family)
    for family in dict.fromkeys(check.family for check in _ALL if check.family != check.name)
}
"""Family name -> its members, in order."""


_MIN_EXAMPLES = 25
"""The fewest examples a member of a family runs (unless ``max_examples`` is lower)."""


def _settings(user: hypothesis.settings | None, share: int) -> hypothesis.settings:
    """``user`` (or the active profile) with no deadline, the too-slow health check off,
    one bug reported, and a family member's share of the examples."""
    base = user if user is not None else hypothesis.settings.default
    assert base is not None  # a profile is always loaded
    examples = max(min(base.max_examples, _MIN_EXAMPLES), base.max_examples // share)
    return hypothesis.settings(
        base,
        deadline=None,
        report_multiple_bugs=False,
        max_examples=examples,
        suppress_health_check=[
            *base.suppress_health_check,
            HealthCheck.too_slow,
            HealthCheck.filter_too_much,  # a kind of drift drawn from a real template
        ],
    )


@attrs.frozen(kw_only=True)
class _Source:
    """Where the episode checks draw from: small integers, or a tokenizer's conversations."""

    tokenizer: Any = None
    reasoning_parser: str | None = None

    def strategy(self, check: _Check) -> st.SearchStrategy[Any]:
        if self.tokenizer is None or check.templated is None:
            return check.strategy
        drawn = check.templated(self.tokenizer, self.reasoning_parser)
        return check.strategy if drawn is None else drawn


def _run(
    check: _Check, parser: Parser, settings: hypothesis.settings | None, source: _Source
) -> None:
    """Run ``check`` under Hypothesis; raise ``PropertyCheckError`` with the shrunk
    counterexample (Hypothesis replays the minimal one last)."""
    failing: list[tuple[Any, str]] = []

    def run(value: Any) -> None:
        try:
            check.body(parser, value)
        except AssertionError as exc:
            failing.append((value, str(exc)))
            raise

    # a name of its own: Hypothesis keys its example database by the test's name
    ident = check.name.replace("[", "__").replace("]", "")
    run.__name__ = run.__qualname__ = f"check_{ident}"
    strategy = source.strategy(check)
    if strategy is not check.strategy:
        run.__name__ = run.__qualname__ = f"check_{ident}__templated"
    test = hypothesis.settings(_settings(settings, check.share))(given(strategy)(run))
    try:
        test()
    except AssertionError as exc:
        if not failing:
            raise
        value, message = failing[-1]
        raise PropertyCheckError(check.name, parser.name, message, value) from exc


def _declared(parser: Parser) -> dict[str, str]:
    """``parser.differences`` by check name (a family stands for each of its members);
    a name that is no check, or a difference without a reason, is a ``ConfigError``."""
    found: dict[str, str] = {}
    for name, why in parser.differences.items():
        if not isinstance(why, str) or not why.strip():
            raise ConfigError(f"{parser.name}: say why it differs from {name!r}")
        members = _FAMILIES.get(name, (name,))
        if members[0] not in _BY_NAME:
            known = ", ".join([*_BY_NAME, *_FAMILIES])
            raise ConfigError(f"{parser.name}: differences names no check {name!r}; known: {known}")
        for member in members:
            found.setdefault(member, why)
    return found


def _select(only: Iterable[str] | None) -> list[str]:
    if only is None:
        return list(_BY_NAME)
    chosen: set[str] = set()
    for name in [only] if isinstance(only, str) else only:
        members = _FAMILIES.get(name, (name,))
        if members[0] not in _BY_NAME:
            raise ConfigError(f"no check {name!r}; known: {', '.join([*_BY_NAME, *_FAMILIES])}")
        chosen.update(members)
    return [name for name in _BY_NAME if name in chosen]


def _planned(parser: Parser, only: Iterable[str] | None) -> list[str]:
    """The checks that run for ``parser``: selected, applicable and not declared."""
    skip = _declared(parser)
    return [n for n in _select(only) if n not in skip and _BY_NAME[n].applies(parser)]


def _leaf(check: _Check) -> Callable[..., None]:
    def run(parser: Parser, *, settings: hypothesis.settings | None = None) -> None:
        if check.name in _planned(parser, [check.name]):
            _run(check, parser, settings, _Source())

    run.__name__ = run.__qualname__ = f"check_{check.name}"
    run.__doc__ = (
        f"{check.body.__doc__}\n\nRaises ``PropertyCheckError`` with the shrunk counterexample; "
        "does nothing when ``parser.differences`` declares the check"
    )
    return run


CHECKS: dict[str, Callable[..., None]] = {check.name: _leaf(check) for check in _ALL}
"""Every check by name, in the order ``check_all`` runs them; each takes a ``Parser`` and
``settings=`` and raises ``PropertyCheckError``."""


def find_failures(
    parser: Parser,
    *,
    settings: hypothesis.settings | None = None,
    only: Iterable[str] | None = None,
    tokenizer: Any = None,
    reasoning_parser: str | None = None,
) -> dict[str, PropertyCheckError]:
    """Run every check (or those ``only`` names, checks or families) on ``parser``, each
    on its own; the ones that failed, by name, with their counterexamples. Checks that
    ``parser.differences`` declares are not run. With ``tokenizer`` the episode checks
    draw its chat template's conversations (see the module docstring); ``reasoning_parser``
    (vLLM's name, e.g. ``qwen3``) when its model writes ``<think>`` blocks."""
    source = _Source(tokenizer=tokenizer, reasoning_parser=reasoning_parser)
    found: dict[str, PropertyCheckError] = {}
    for name in _planned(parser, only):
        try:
            _run(_BY_NAME[name], parser, settings, source)
        except PropertyCheckError as failure:
            found[name] = failure
    return found


def check_all(
    parser: Parser,
    *,
    settings: hypothesis.settings | None = None,
    only: Iterable[str] | None = None,
    tokenizer: Any = None,
    reasoning_parser: str | None = None,
) -> list[str]:
    """Run every check (or those ``only`` names); raise one ``AssertionError`` listing
    each failure with its input. Returns the names of the checks that ran. ``tokenizer``
    and ``reasoning_parser``: as for `find_failures`."""
    ran = _planned(parser, only)
    skipped = {n: why for n, why in _declared(parser).items() if n in _select(only)}
    for name, why in skipped.items():
        logger.info("%s: %s not run (declared difference: %s)", parser.name, name, why)
    found = find_failures(
        parser,
        settings=settings,
        only=only,
        tokenizer=tokenizer,
        reasoning_parser=reasoning_parser,
    )
    if found:
        notes = "".join(f"\n  {n}: {why}" for n, why in skipped.items())
        raise AssertionError(
            f"{len(found)} of {len(ran)} checks failed for {parser.name}:\n\n"
            + "\n\n".join(f"[{name}] {failure.message}" for name, failure in found.items())
            + (f"\n\nnot run (declared differences):{notes}" if notes else "")
        )
    return ran


def _family(family: str) -> Callable[..., None]:
    members = _FAMILIES[family]

    def run(parser: Parser, *, settings: hypothesis.settings | None = None) -> None:
        found = find_failures(parser, settings=settings, only=[family])
        if not found:
            return
        first, *others = found.values()
        if not others:
            raise first
        also = ", ".join(o.check for o in others)
        raise PropertyCheckError(
            first.check,
            first.parser,
            f"{first.message}\n(also failed: {also})",
            first.counterexample,
        )

    run.__name__ = run.__qualname__ = f"check_{family}"
    run.__doc__ = (
        f"Run {', '.join(members)}, each on its own; raise ``PropertyCheckError`` for the "
        "first that failed, naming the others (``find_failures`` returns each)."
    )
    return run


check_stitching = CHECKS["stitching"]
check_env_tokens_not_trained = CHECKS["env_tokens_not_trained"]
check_policy_tokens_trained = CHECKS["policy_tokens_trained"]
check_logprobs = CHECKS["logprobs"]
check_reward = CHECKS["reward"]
check_num_turns = CHECKS["num_turns"]
check_logprob_count_mismatch_not_trained = CHECKS["logprob_count_mismatch_not_trained"]
check_drift_rejected = _family("drift_rejected")
check_failures_not_trained = _family("failures_not_trained")
check_never_crashes = _family("never_crashes")
