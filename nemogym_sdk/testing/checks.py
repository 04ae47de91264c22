"""Ready-made property checks for any NeMo Gym parser (``/run`` result -> training sample).

Point a check at a parser through a ``Parser``: the function to test and an adapter
that turns its output into ``Sample`` records (``seed_dict_samples`` for the seed's dict
shape axolotl's parser returns, ``rollout_samples`` for this SDK's ``Rollout``). Each
check runs Hypothesis over generated ``/run`` results and raises ``PropertyCheckError``
(an ``AssertionError``) carrying the shrunk counterexample::

    from nemogym_sdk.testing import Parser, check_all

    check_all(Parser(parse=my_parse, samples=my_adapter, name="mine"))

The properties:

- ``check_stitching``: a well-formed episode becomes one trainable sample whose prompt +
  completion reproduces every turn's prompt and generation, token for token.
- ``check_logprobs``: every trained token carries its own sampled logprob; a turn whose
  logprob count differs from its token count is never trained (no padding, no cutting).
- ``check_env_tokens_not_trained``: tool outputs and template glue are never trained.
- ``check_drift_rejected``: a history that drifted is rejected, marked, or split at the
  drift, never stitched silently into a misaligned sample.
- ``check_failures_not_trained``: agent errors, empty output, missing token ids and
  ``mask_sample`` give no trainable sample.
- ``check_never_crashes``: malformed JSON of any shape (dicts, or bytes when the parser
  takes bytes) never raises anything but a declared rejection.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs
import hypothesis
from hypothesis import given
from hypothesis import strategies as st

from nemogym_sdk.testing.episodes import Episode, episodes
from nemogym_sdk.testing.parsers import Parser, PropertyCheckError, Sample
from nemogym_sdk.testing.responses import (
    FAILURE_KINDS,
    FailureCase,
    FailureKind,
    failures,
    json_values,
    mangled_responses,
    raw_responses,
)

__all__ = [
    "CHECKS",
    "check_all",
    "check_drift_rejected",
    "check_env_tokens_not_trained",
    "check_failures_not_trained",
    "check_logprobs",
    "check_never_crashes",
    "check_stitching",
    "find_failures",
]


def _run(parser: Parser, response: Any) -> list[Sample] | None:
    """The parser's samples, or ``None`` when it rejected the input on purpose."""
    try:
        output = parser.parse(response)
    except parser.rejects:
        return None
    except Exception as exc:
        raise AssertionError(f"parsing raised {type(exc).__name__}: {exc}") from exc
    try:
        samples = list(parser.samples(output))
    except Exception as exc:
        raise AssertionError(
            f"the output cannot be read as samples ({type(exc).__name__}: {exc}): {output!r}"
        ) from exc
    for sample in samples:
        n = len(sample.completion_ids)
        if len(sample.train_mask) != n or len(sample.logprobs) != n:
            raise AssertionError(
                f"array lengths disagree (completion {n}, mask {len(sample.train_mask)}, "
                f"logprobs {len(sample.logprobs)}): {sample.describe()}"
            )
        if not set(sample.train_mask) <= {0, 1}:
            raise AssertionError(f"the mask is not 0/1: {sample.describe()}")
    return samples


def _trainable(samples: list[Sample] | None) -> list[Sample]:
    return [s for s in samples or [] if s.trainable]


def _show(samples: Sequence[Sample]) -> str:
    return "\n".join(f"  sample {i}: {s.describe()}" for i, s in enumerate(samples)) or "  none"


def _property(
    name: str, strategy: st.SearchStrategy[Any], body: Callable[[Parser, Any], None], doc: str
) -> Callable[..., None]:
    """Make ``check_<name>``: run ``body`` over ``strategy`` and raise ``PropertyCheckError``
    with the shrunk counterexample (Hypothesis replays the minimal one last)."""

    def check(parser: Parser, *, settings: hypothesis.settings | None = None) -> None:
        failing: list[tuple[Any, str]] = []

        def run(value: Any) -> None:
            try:
                body(parser, value)
            except AssertionError as exc:
                failing.append((value, str(exc)))
                raise

        # a name of its own: Hypothesis keys its example database by the test's name
        run.__name__ = run.__qualname__ = f"check_{name}"
        test = given(strategy)(run)
        test = hypothesis.settings(
            settings or hypothesis.settings(deadline=None), report_multiple_bugs=False
        )(test)
        try:
            test()
        except AssertionError as exc:
            if not failing:
                raise
            value, message = failing[-1]
            raise PropertyCheckError(name, parser.name, message, value) from exc

    check.__name__ = check.__qualname__ = f"check_{name}"
    check.__doc__ = doc + "\n\nRaises ``PropertyCheckError`` with the shrunk counterexample."
    return check


# --- the properties -----------------------------------------------------------------------


def _stitching(parser: Parser, episode: Episode) -> None:
    samples = _run(parser, episode.response)
    trainable = _trainable(samples)
    drawn = episode.describe()
    if len(trainable) != 1:
        raise AssertionError(
            f"a well-formed episode gave {len(trainable)} trainable samples, not 1\n"
            f"{drawn}\n{_show(samples or [])}"
        )
    (sample,) = trainable
    stitched = list(sample.prompt_ids + sample.completion_ids)
    position = len(sample.prompt_ids)
    if list(sample.prompt_ids) != list(episode.prompts[0]):
        raise AssertionError(f"the prompt is not turn 0's prompt\n{drawn}\n{_show([sample])}")
    for turn, (prompt, generation) in enumerate(
        zip(episode.prompts, episode.generations, strict=True)
    ):
        if stitched[: len(prompt)] != list(prompt):
            raise AssertionError(
                f"prompt + completion does not reproduce turn {turn}'s prompt\n"
                f"{drawn}\n{_show([sample])}"
            )
        position = len(prompt) + len(generation)
        if stitched[len(prompt) : position] != list(generation):
            raise AssertionError(
                f"turn {turn}'s generation does not follow its prompt\n{drawn}\n{_show([sample])}"
            )
    if len(stitched) != position:
        raise AssertionError(
            f"the sample has {len(stitched) - position} tokens after the last generation\n"
            f"{drawn}\n{_show([sample])}"
        )


_NEGATIVE = st.floats(min_value=-30.0, max_value=-1 / 64, allow_nan=False)


@st.composite
def _logprob_cases(draw: st.DrawFn) -> tuple[Episode, dict[str, Any], int | None]:
    """An episode (drifting or not, logprobs < 0 so a padded 0.0 stands out) and its
    response, in which one turn's logprob count is sometimes wrong."""
    episode = draw(episodes(drift=True, max_turns=4, logprobs=_NEGATIVE))
    response = json.loads(json.dumps(episode.response))
    if not draw(st.booleans()):
        return episode, response, None
    turn = draw(st.integers(0, episode.num_turns - 1))
    items = [i for i in response["response"]["output"] if "generation_token_ids" in i]
    lps = items[turn]["generation_log_probs"]
    if draw(st.booleans()):
        items[turn]["generation_log_probs"] = lps[: draw(st.integers(0, len(lps) - 1))]
    else:
        items[turn]["generation_log_probs"] = [*lps, -draw(st.integers(1, 30)) / 8]
    return episode, response, turn


def _whole_turns(
    pairs: list[tuple[int, float]], blocks: list[list[tuple[int, float]] | None]
) -> bool:
    """Whether ``pairs`` is a concatenation of some of ``blocks`` in order (``None``: a
    block that can never be used)."""
    reachable = {0}
    for block in blocks:
        if block is None:
            continue
        reachable |= {
            start + len(block) for start in reachable if pairs[start : start + len(block)] == block
        }
    return len(pairs) in reachable


def _logprobs(parser: Parser, case: tuple[Episode, dict[str, Any], int | None]) -> None:
    episode, response, broken = case
    samples = _run(parser, response)
    pairs = [pair for sample in _trainable(samples) for pair in sample.trained()]
    blocks: list[list[tuple[int, float]] | None] = [
        None if turn == broken else list(zip(gen, lps, strict=True))
        for turn, (gen, lps) in enumerate(zip(episode.generations, episode.logprobs, strict=True))
    ]
    sent = (
        ""
        if broken is None
        else (
            f"\nturn {broken} was sent {len(_sent_logprobs(response, broken))} logprobs for "
            f"{len(episode.generations[broken])} tokens: {_sent_logprobs(response, broken)}"
        )
    )
    if not _whole_turns(pairs, blocks):
        raise AssertionError(
            "trained tokens do not carry their own logprobs (whole turns, as sampled)\n"
            f"{episode.describe()}{sent}\ntrained (token, logprob): {pairs}\n{_show(samples or [])}"
        )
    if broken is None and not episode.drift_turns:
        expected = [pair for block in blocks for pair in block or []]
        if pairs != expected:
            raise AssertionError(
                f"a well-formed episode trains {pairs}, not every turn's {expected}\n"
                f"{episode.describe()}\n{_show(samples or [])}"
            )


def _sent_logprobs(response: Mapping[str, Any], turn: int) -> list[float]:
    """``generation_log_probs`` of model turn ``turn`` of ``response``."""
    items = [i for i in response["response"]["output"] if "generation_token_ids" in i]
    return list(items[turn]["generation_log_probs"])


def _env_tokens(parser: Parser, episode: Episode) -> None:
    samples = _run(parser, episode.response)
    generated = [t for generation in episode.generations for t in generation]
    for sample in _trainable(samples):
        trained = [t for t, _ in sample.trained()]
        if trained != generated[: len(trained)] or len(trained) not in _turn_ends(episode):
            raise AssertionError(
                f"trained tokens {trained} are not the generated ones {generated}: an "
                f"environment or prompt token is trained\n{episode.describe()}\n{_show([sample])}"
            )


def _turn_ends(episode: Episode) -> set[int]:
    ends, total = {0}, 0
    for generation in episode.generations:
        total += len(generation)
        ends.add(total)
    return ends


def _drift(parser: Parser, episode: Episode) -> None:
    samples = _run(parser, episode.response)
    if samples is None:
        return
    allowed = []
    for group in episode.segments():
        for start in range(len(group)):
            for stop in range(start + 1, len(group) + 1):
                allowed.append(episode.expected_sample(group[start:stop]))
    for sample in _trainable(samples):
        seen = {
            "prompt_ids": list(sample.prompt_ids),
            "completion_ids": list(sample.completion_ids),
            "env_mask": list(sample.train_mask),
            "logprobs": list(sample.logprobs),
        }
        if seen not in allowed:
            raise AssertionError(
                "a drifting history was stitched into a trainable sample that is not a "
                "drift-free run of turns (the policy would be trained on context it never "
                f"saw)\n{episode.describe()}\n{_show([sample])}"
            )


def _failures(parser: Parser, case: FailureCase) -> None:
    samples = _run(parser, case.response)
    if _trainable(samples):
        raise AssertionError(
            f"a failure ({case.kind}) gave a trainable sample\n{case.describe()}\n"
            f"{_show(samples or [])}"
        )


def _crash(parser: Parser, value: Any) -> None:
    responses: list[Any] = [value]
    if parser.takes_bytes:
        responses.append(json.dumps(value).encode())
    for response in responses:
        for sample in _trainable(_run(parser, response)):
            if not math.isfinite(sample.reward) or not all(map(math.isfinite, sample.logprobs)):
                raise AssertionError(f"a trainable sample is not finite: {sample.describe()}")


def _crash_bytes(parser: Parser, raw: bytes) -> None:
    if parser.takes_bytes:
        _crash(attrs.evolve(parser, takes_bytes=False), raw)


check_stitching = _property(
    "stitching",
    episodes(max_turns=5),
    _stitching,
    "A well-formed episode becomes one trainable sample whose prompt + completion "
    "reproduces every turn's prompt and generation.",
)
check_logprobs = _property(
    "logprobs",
    _logprob_cases(),
    _logprobs,
    "Trained tokens carry their own sampled logprobs, whole turns at a time; a turn whose "
    "logprob count differs from its token count is never trained.",
)
check_env_tokens_not_trained = _property(
    "env_tokens_not_trained",
    episodes(max_turns=5),
    _env_tokens,
    "Only generated tokens are trained: tool outputs and template glue never are.",
)
check_drift_rejected = _property(
    "drift_rejected",
    episodes(drift=True, min_turns=2),
    _drift,
    "Every trainable sample of a drifting episode is a drift-free run of its turns "
    "(rejected, marked or forked, never stitched across the drift).",
)


def _each_kind(
    name: str,
    kinds: tuple[FailureKind, ...],
    body: Callable[[Parser, Any], None],
    doc: str,
) -> Callable[..., None]:
    """Make ``check_<name>`` over every failure kind in turn, each with an equal share of
    the examples: drawn from all kinds at once, Hypothesis favours the first ones, and a
    100-example run could miss a kind that always fails (``mask_sample``) altogether."""
    checks = [_property(name, failures(kinds=(kind,)), body, doc) for kind in kinds]

    def check(parser: Parser, *, settings: hypothesis.settings | None = None) -> None:
        base = settings or hypothesis.settings(deadline=None)
        share = hypothesis.settings(base, max_examples=max(1, base.max_examples // len(kinds)))
        for each in checks:
            each(parser, settings=share)

    check.__name__ = check.__qualname__ = f"check_{name}"
    check.__doc__ = checks[0].__doc__
    return check


check_failures_not_trained = _each_kind(
    "failures_not_trained",
    tuple(k for k in FAILURE_KINDS if k != "logprob_count_mismatch"),
    _failures,
    "Agent errors, empty output, output without an answer, missing token ids and "
    "mask_sample give no trainable sample.",
)
_check_mangled = _property(
    "never_crashes",
    mangled_responses() | json_values(),
    _crash,
    "Malformed dicts never crash the parser.",
)
_check_raw = _property(
    "never_crashes", raw_responses(), _crash_bytes, "Raw bytes never crash the parser."
)


def check_never_crashes(parser: Parser, *, settings: hypothesis.settings | None = None) -> None:
    """Malformed ``/run`` results (and raw bytes, when the parser takes bytes) never raise
    anything but a declared rejection, and give consistent, finite samples."""
    _check_mangled(parser, settings=settings)
    if parser.takes_bytes:
        _check_raw(parser, settings=settings)


CHECKS: dict[str, Callable[..., None]] = {
    "stitching": check_stitching,
    "logprobs": check_logprobs,
    "env_tokens_not_trained": check_env_tokens_not_trained,
    "drift_rejected": check_drift_rejected,
    "failures_not_trained": check_failures_not_trained,
    "never_crashes": check_never_crashes,
}
"""Every check by name, in the order ``check_all`` runs them."""


def find_failures(
    parser: Parser, *, settings: hypothesis.settings | None = None
) -> dict[str, PropertyCheckError]:
    """Run every check; the ones that failed, by name, with their counterexamples."""
    found: dict[str, PropertyCheckError] = {}
    for name, check in CHECKS.items():
        try:
            check(parser, settings=settings)
        except PropertyCheckError as failure:
            found[name] = failure
    return found


def check_all(parser: Parser, *, settings: hypothesis.settings | None = None) -> None:
    """Run every check; raise one ``AssertionError`` listing each failure."""
    found = find_failures(parser, settings=settings)
    if found:
        raise AssertionError(
            f"{len(found)} of {len(CHECKS)} checks failed for {parser.name}:\n\n"
            + "\n\n".join(f"[{name}] {failure.message}" for name, failure in found.items())
        )
