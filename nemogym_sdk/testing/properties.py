"""The properties behind the kit's checks: one function per property, given a ``Parser``
and one drawn input, raising ``AssertionError`` with that input drawn.

Well-formed episodes are checked against their ground truth one field at a time
(``stitching``: prompt and completion; ``env_tokens_not_trained`` and
``policy_tokens_trained``: the train mask; ``logprobs``; ``reward``; ``num_turns``), so a
parser with one known difference is still checked on every other field. The others take
the inputs that must not be trained as they are (a turn with a miscounted logprob list,
a drifted history, a failure shape) and malformed input. ``nemogym_sdk.testing.checks``
runs each one under Hypothesis.

Positions are compared by what they hold (``roles``): the ``j``-th generated token of a
turn, or context. When a sample's prompt + completion is a prefix of the episode's
ground-truth sequence (the whole episode, or the turns up to some turn) the roles are
exact; otherwise each turn's generation is looked for in the completion, in turn order.
"""

from __future__ import annotations

import json
import math
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from nemogym_sdk.testing.episodes import Episode
from nemogym_sdk.testing.parsers import Parser, Sample
from nemogym_sdk.testing.responses import FailureCase

__all__ = [
    "Role",
    "close",
    "drift_rejected",
    "env_tokens_not_trained",
    "failures_not_trained",
    "forms",
    "layout",
    "logprob_count_mismatch_not_trained",
    "logprobs",
    "never_crashes",
    "never_crashes_bytes",
    "num_turns",
    "policy_tokens_trained",
    "render",
    "reward",
    "roles",
    "run_parser",
    "show",
    "stitching",
    "trainable",
]

Role = tuple[int, int] | None
"""What a completion position holds: ``(turn, j)``, the ``j``-th generated token of model
turn ``turn``, or ``None`` for context (an environment or prompt token)."""

_SHOW_CHARS = 1500
_SHOW_BYTES = 400


def close(got: Any, want: float) -> bool:
    """``got`` is a number equal to ``want`` up to float32 rounding (a trainer may keep
    logprobs and rewards in float32)."""
    if isinstance(got, bool) or not isinstance(got, int | float):
        return False
    return math.isclose(got, want, rel_tol=1e-6, abs_tol=1e-6)


def _finite(x: Any) -> bool:
    return isinstance(x, int | float) and math.isfinite(x)


def render(value: Any) -> str:
    """An input as a failure message shows it: JSON for decoded values, bytes as bytes."""
    if isinstance(value, bytes | bytearray):
        more = "..." if len(value) > _SHOW_BYTES else ""
        return f"{len(value)} bytes {bytes(value[:_SHOW_BYTES])!r}{more}"
    try:
        text = json.dumps(value, default=repr)
    except (TypeError, ValueError):
        text = repr(value)
    if len(text) > _SHOW_CHARS:
        return f"{text[:_SHOW_CHARS]}... ({len(text)} characters)"
    return text


def _where(exc: BaseException) -> str:
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return ""
    frame = frames[-1]
    return f" (at {Path(frame.filename).name}:{frame.lineno}, in {frame.name})"


def run_parser(parser: Parser, response: Any, drawn: str) -> list[Sample] | None:
    """The parser's samples of ``response``, or ``None`` when it rejected the input on
    purpose (``Parser.rejects``); a crash or inconsistent arrays raise ``AssertionError``
    ending with ``drawn`` (the input, as the message should show it)."""
    try:
        output = parser.parse(response)
    except parser.rejects:
        return None
    except Exception as exc:
        raise AssertionError(
            f"parsing raised {type(exc).__name__}: {exc}{_where(exc)}\n{drawn}"
        ) from exc
    try:
        samples = list(parser.samples(output))
    except Exception as exc:
        raise AssertionError(
            f"the output cannot be read as samples ({type(exc).__name__}: {exc}{_where(exc)})"
            f": {output!r}\n{drawn}"
        ) from exc
    for sample in samples:
        n = len(sample.completion_ids)
        if len(sample.train_mask) != n or len(sample.logprobs) != n:
            raise AssertionError(
                f"array lengths disagree (completion {n}, mask {len(sample.train_mask)}, "
                f"logprobs {len(sample.logprobs)}): {sample.describe()}\n{drawn}"
            )
        if not set(sample.train_mask) <= {0, 1}:
            raise AssertionError(f"the mask is not 0/1: {sample.describe()}\n{drawn}")
    return samples


def forms(parser: Parser, response: Any) -> list[tuple[str, Any]]:
    """``response`` as the parser is fed it: decoded, and as JSON bytes when it takes bytes."""
    if not parser.takes_bytes:
        return [("decoded JSON", response)]
    return [("decoded JSON", response), ("JSON bytes", json.dumps(response).encode())]


def _each_form(parser: Parser, response: Any, drawn: str) -> list[tuple[str, list[Sample] | None]]:
    """``(drawn, samples)`` for each form ``response`` is fed in."""
    found = []
    for form, value in forms(parser, response):
        shown = drawn if form == "decoded JSON" else f"{drawn}\n(fed as {form})"
        found.append((shown, run_parser(parser, value, shown)))
    return found


def trainable(samples: list[Sample] | None) -> list[Sample]:
    """The samples that go into the loss."""
    return [s for s in samples or [] if s.trainable]


def show(samples: Sequence[Sample]) -> str:
    """The samples drawn one per line."""
    return "\n".join(f"  sample {i}: {s.describe()}" for i, s in enumerate(samples)) or "  none"


# --- where the generated tokens are --------------------------------------------------------


def layout(episode: Episode) -> tuple[list[int], list[Role]]:
    """A well-formed episode's ground-truth sequence (turn 0's prompt, then each turn's
    environment tokens and generation) and the role of each position."""
    tokens = list(episode.prompts[0])
    placed: list[Role] = [None] * len(tokens)
    for turn, generation in enumerate(episode.generations):
        if turn:
            delta = episode.prompts[turn][len(episode.history(turn)) :]
            tokens += delta
            placed += [None] * len(delta)
        tokens += generation
        placed += [(turn, j) for j in range(len(generation))]
    return tokens, placed


def _find(haystack: list[int], needle: list[int], start: int) -> int | None:
    for i in range(start, len(haystack) - len(needle) + 1):
        if haystack[i : i + len(needle)] == needle:
            return i
    return None


def roles(sample: Sample, episode: Episode) -> list[Role]:
    """The role of each of ``sample``'s completion positions in well-formed ``episode``:
    read off the ground truth when prompt + completion is the ground-truth sequence up to
    the end of some turn's generation, else found by looking for each generation in turn."""
    tokens, placed = layout(episode)
    seen = [*sample.prompt_ids, *sample.completion_ids]
    ends = {
        i + 1
        for i, role in enumerate(placed)
        if role is not None and role[1] == len(episode.generations[role[0]]) - 1
    }
    if len(seen) in ends and seen == tokens[: len(seen)]:
        return placed[len(sample.prompt_ids) : len(seen)]
    completion = list(sample.completion_ids)
    found: list[Role] = [None] * len(completion)
    cursor = 0
    for turn, generation in enumerate(episode.generations):
        at = _find(completion, list(generation), cursor)
        if at is not None:
            found[at : at + len(generation)] = [(turn, j) for j in range(len(generation))]
            cursor = at + len(generation)
    return found


def _trained_roles(sample: Sample, episode: Episode) -> list[tuple[int, Role]]:
    """``(position, role)`` of every trained completion position."""
    return [
        (i, role)
        for i, (m, role) in enumerate(zip(sample.train_mask, roles(sample, episode), strict=True))
        if m == 1
    ]


# --- ground truth on well-formed episodes -----------------------------------------------------


def _stitching(episode: Episode, samples: list[Sample] | None, drawn: str) -> None:
    found = trainable(samples)
    if len(found) != 1:
        raise AssertionError(
            f"a well-formed episode gave {len(found)} trainable samples, not 1\n"
            f"{drawn}\n{show(samples or [])}"
        )
    (sample,) = found
    stitched = list(sample.prompt_ids + sample.completion_ids)
    if list(sample.prompt_ids) != list(episode.prompts[0]):
        raise AssertionError(f"the prompt is not turn 0's prompt\n{drawn}\n{show([sample])}")
    position = 0
    for turn, (prompt, generation) in enumerate(
        zip(episode.prompts, episode.generations, strict=True)
    ):
        if stitched[: len(prompt)] != list(prompt):
            raise AssertionError(
                f"prompt + completion does not reproduce turn {turn}'s prompt\n"
                f"{drawn}\n{show([sample])}"
            )
        position = len(prompt) + len(generation)
        if stitched[len(prompt) : position] != list(generation):
            raise AssertionError(
                f"turn {turn}'s generation does not follow its prompt\n{drawn}\n{show([sample])}"
            )
    if len(stitched) != position:
        raise AssertionError(
            f"the sample has {len(stitched) - position} tokens after the last generation\n"
            f"{drawn}\n{show([sample])}"
        )


def stitching(parser: Parser, episode: Episode) -> None:
    """One trainable sample whose prompt is turn 0's prompt and whose prompt + completion
    reproduces every turn's prompt and generation, and nothing after the last one."""
    for drawn, samples in _each_form(parser, episode.response, episode.describe()):
        _stitching(episode, samples, drawn)


def _token(episode: Episode, role: tuple[int, int]) -> str:
    turn, j = role
    return f"turn {turn} token {j} ({episode.generations[turn][j]})"


def env_tokens_not_trained(parser: Parser, episode: Episode) -> None:
    """No trainable sample trains a position that is not a generated token."""
    for drawn, samples in _each_form(parser, episode.response, episode.describe()):
        for sample in trainable(samples):
            context = [i for i, role in _trained_roles(sample, episode) if role is None]
            if context:
                tokens = [sample.completion_ids[i] for i in context]
                raise AssertionError(
                    f"completion positions {context} (tokens {tokens}) are trained but are "
                    "not generated tokens: an environment or prompt token is trained\n"
                    f"{drawn}\n{show([sample])}"
                )


def policy_tokens_trained(parser: Parser, episode: Episode) -> None:
    """Every generated token of every turn is trained (in some trainable sample)."""
    for drawn, samples in _each_form(parser, episode.response, episode.describe()):
        trained = {
            role for sample in trainable(samples) for _, role in _trained_roles(sample, episode)
        }
        missing = [
            (turn, j)
            for turn, generation in enumerate(episode.generations)
            for j in range(len(generation))
            if (turn, j) not in trained
        ]
        if missing:
            raise AssertionError(
                "generated tokens are not trained: "
                + ", ".join(_token(episode, role) for role in missing)
                + f"\n{drawn}\n{show(samples or [])}"
            )


def _wrong_logprobs(sample: Sample, episode: Episode, skip_turn: int | None = None) -> list[str]:
    """Each trained generated position whose logprob is not the sampled one, in words."""
    wrong = []
    for i, role in _trained_roles(sample, episode):
        if role is None or role[0] == skip_turn:
            continue
        sampled = episode.logprobs[role[0]][role[1]]
        if not close(sample.logprobs[i], sampled):
            got = sample.logprobs[i]
            wrong.append(f"position {i}, {_token(episode, role)}: {got!r}, sampled {sampled!r}")
    return wrong


def logprobs(parser: Parser, episode: Episode) -> None:
    """Every logprob of a trainable sample is finite, and each trained generated token
    carries the logprob it was sampled with."""
    for drawn, samples in _each_form(parser, episode.response, episode.describe()):
        for sample in trainable(samples):
            if not all(map(_finite, sample.logprobs)):
                raise AssertionError(
                    "a trainable sample has a logprob that is not a finite number (even an "
                    f"untrained one turns a masked sum into NaN)\n{drawn}\n{show([sample])}"
                )
            wrong = _wrong_logprobs(sample, episode)
            if wrong:
                raise AssertionError(
                    "trained tokens do not carry their own sampled logprobs: "
                    + "; ".join(wrong)
                    + f"\n{drawn}\n{show([sample])}"
                )


def reward(parser: Parser, episode: Episode) -> None:
    """Every trainable sample carries the episode's reward (integer rewards included)."""
    for drawn, samples in _each_form(parser, episode.response, episode.describe()):
        for sample in trainable(samples):
            if not close(sample.reward, float(episode.reward)):
                raise AssertionError(
                    f"the sample's reward is {sample.reward!r}, the episode's is "
                    f"{episode.reward!r} (JSON {json.dumps(episode.reward)})\n"
                    f"{drawn}\n{show([sample])}"
                )


def num_turns(parser: Parser, episode: Episode) -> None:
    """Every trainable sample reports the episode's number of model turns."""
    for drawn, samples in _each_form(parser, episode.response, episode.describe()):
        for sample in trainable(samples):
            if sample.num_turns is None:
                raise AssertionError(
                    "the samples report no num_turns (Sample.num_turns is None): fill it in "
                    "from the parser's output, or declare the difference: "
                    f"Parser(differences={{'num_turns': 'why'}})\n{drawn}\n{show([sample])}"
                )
            if sample.num_turns != episode.num_turns:
                raise AssertionError(
                    f"the sample reports {sample.num_turns} model turns, the episode has "
                    f"{episode.num_turns}\n{drawn}\n{show([sample])}"
                )


# --- inputs that must not be trained as they are ------------------------------------------


def logprob_count_mismatch_not_trained(parser: Parser, case: FailureCase) -> None:
    """A turn whose logprob count differs from its token count is never trained (neither
    padded nor cut), and it shifts no other turn's logprobs."""
    assert case.turn is not None, "a logprob_count_mismatch case names its turn"
    episode = case.episode
    for drawn, samples in _each_form(parser, case.response, case.describe()):
        for sample in trainable(samples):
            placed = _trained_roles(sample, episode)
            broken = [i for i, role in placed if role is not None and role[0] == case.turn]
            if broken:
                raise AssertionError(
                    f"turn {case.turn} was sent {_count(case.logprobs)} logprobs for "
                    f"{len(episode.generations[case.turn])} tokens, and positions {broken} of "
                    f"it are trained with logprobs {[sample.logprobs[i] for i in broken]}: a "
                    f"miscounted turn is padded or cut\n{drawn}\n{show([sample])}"
                )
            shifted = _wrong_logprobs(sample, episode, skip_turn=case.turn)
            if shifted:
                raise AssertionError(
                    f"turn {case.turn}'s miscounted logprobs moved other turns' logprobs: "
                    + "; ".join(shifted)
                    + f"\n{drawn}\n{show([sample])}"
                )


def _count(sent: tuple[float, ...] | None) -> str:
    return "no" if sent is None else str(len(sent))


def _same(sample: Sample, expected: dict[str, list[Any]]) -> bool:
    if (
        list(sample.prompt_ids) != expected["prompt_ids"]
        or list(sample.completion_ids) != expected["completion_ids"]
        or list(sample.train_mask) != expected["env_mask"]
    ):
        return False
    return all(
        close(lp, want)
        for lp, want, m in zip(
            sample.logprobs, expected["logprobs"], sample.train_mask, strict=True
        )
        if m == 1
    )


def drift_rejected(parser: Parser, episode: Episode) -> None:
    """Every trainable sample of a drifting episode is a drift-free run of its turns."""
    allowed = [
        episode.expected_sample(group[start:stop])
        for group in episode.segments()
        for start in range(len(group))
        for stop in range(start + 1, len(group) + 1)
    ]
    for drawn, samples in _each_form(parser, episode.response, episode.describe()):
        for sample in trainable(samples):
            if not any(_same(sample, expected) for expected in allowed):
                raise AssertionError(
                    "a drifting history was stitched into a trainable sample that is not a "
                    "drift-free run of turns (the policy would be trained on context it "
                    f"never saw)\n{drawn}\n{show([sample])}"
                )


def failures_not_trained(parser: Parser, case: FailureCase) -> None:
    """A failure shape gives no trainable sample."""
    for drawn, samples in _each_form(parser, case.response, case.describe()):
        if trainable(samples):
            raise AssertionError(
                f"a failure ({case.kind}) gave a trainable sample\n{drawn}\n{show(samples or [])}"
            )


# --- malformed input -------------------------------------------------------------------------


def _no_crash(parser: Parser, response: Any, form: str) -> None:
    drawn = f"input ({form}): {render(response)}"
    for sample in trainable(run_parser(parser, response, drawn)):
        if not _finite(sample.reward) or not all(map(_finite, sample.logprobs)):
            raise AssertionError(f"a trainable sample is not finite: {sample.describe()}\n{drawn}")


def never_crashes(parser: Parser, value: Any) -> None:
    """Malformed decoded JSON (and its bytes, when the parser takes bytes) raises nothing
    but a declared rejection and gives finite samples."""
    for form, response in forms(parser, value):
        _no_crash(parser, response, form)


def never_crashes_bytes(parser: Parser, raw: bytes) -> None:
    """Raw bodies (valid, truncated, noise) raise nothing but a declared rejection."""
    _no_crash(parser, raw, "raw bytes")
