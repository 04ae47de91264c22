"""Hypothesis strategies for ``/run`` results that must not become training samples.

``failures()`` draws the failure shapes NeMo Gym produces (an agent error, no output, no
token ids, a logprob count that differs from the token count, ``mask_sample``, a reward,
logprob or token id that is not a number of the right kind), each with the
``RolloutStatus`` ``parse_agent_response`` gives it. ``json_values()``,
``mangled_responses()`` and ``raw_responses()`` feed the "never crashes" properties:
arbitrary JSON, valid episodes with subtrees replaced by junk of any type, and raw bytes
(valid JSON, truncated JSON, or noise).
"""

from __future__ import annotations

import copy
import json
import math
from typing import Any, Literal, get_args

import attrs
from hypothesis import strategies as st

from nemogym_sdk import RolloutStatus
from nemogym_sdk.testing.episodes import Episode, episodes

__all__ = [
    "FAILURE_KINDS",
    "FailureCase",
    "failures",
    "json_values",
    "mangled_responses",
    "raw_responses",
]

FailureKind = Literal[
    "agent_error",
    "empty_output",
    "no_answer",
    "no_token_ids",
    "logprob_count_mismatch",
    "mask_sample",
    "invalid_reward",
    "invalid_logprobs",
    "invalid_token_ids",
]
FAILURE_KINDS: tuple[FailureKind, ...] = get_args(FailureKind)
"""Every failure shape ``failures()`` draws."""

_TOKEN_FIELDS = ("prompt_token_ids", "generation_token_ids", "generation_log_probs")
_NOT_FINITE = st.sampled_from([math.nan, math.inf, -math.inf])
_BAD_REWARDS: st.SearchStrategy[Any] = _NOT_FINITE | st.sampled_from([None, "1.0", True, [1.0], {}])
"""Rewards no trainer can use: not finite, or not a number (a string, a bool, a list)."""
_BAD_LOGPROBS: st.SearchStrategy[Any] = _NOT_FINITE | st.sampled_from(
    [None, "-0.5", True, [-0.5, -0.25]]
)
"""Logprob entries that are not finite numbers."""
_BAD_TOKENS: st.SearchStrategy[Any] = st.sampled_from(["5", 5.5, True, None, [5, 6], 2**64])
"""Token id entries that are not int64 integers (a string, a float, a bool, a pair)."""


@attrs.frozen(kw_only=True)
class FailureCase:
    """A ``/run`` result that must not be trained on, and why."""

    response: dict[str, Any]
    """The broken ``/run`` result."""
    kind: FailureKind
    """Which failure shape it is."""
    status: RolloutStatus
    """The status ``parse_agent_response`` gives it."""
    episode: Episode
    """The well-formed episode the failure was made from."""
    turn: int | None = None
    """The model turn that was broken (``logprob_count_mismatch`` and ``invalid_*`` of a
    turn's arrays)."""
    logprobs: tuple[float, ...] | None = None
    """That turn's ``generation_log_probs`` as sent (``None``: the field is absent)."""
    detail: str = ""
    """What was changed, in words (e.g. ``generation_token_ids[1] of turn 0 is '5'``)."""

    def describe(self) -> str:
        """The failure and its episode, drawn with tokens."""
        where = "" if self.turn is None else f" at turn {self.turn}"
        sent = "" if self.kind != "logprob_count_mismatch" else f", sent {self.logprobs}"
        detail = f": {self.detail}" if self.detail else ""
        return f"{self.kind}{where}{sent}{detail}\n{self.episode.describe()}"


def _model_items(response: dict[str, Any]) -> list[dict[str, Any]]:
    return [item for item in response["response"]["output"] if "generation_token_ids" in item]


_Broken = tuple[RolloutStatus, int | None, tuple[float, ...] | None, str]
"""What a breaker did: the status, the turn it broke, the logprobs it sent, in words."""


def _miscount(draw: st.DrawFn, response: dict[str, Any], episode: Episode) -> _Broken:
    turn = draw(st.integers(0, episode.num_turns - 1))
    item = _model_items(response)[turn]
    lps = list(item["generation_log_probs"])
    how = draw(st.sampled_from(["short", "long", "absent"]))
    if how == "absent":
        del item["generation_log_probs"]
        return RolloutStatus.INVALID, turn, None, "generation_log_probs is absent"
    if how == "short":
        lps = lps[: draw(st.integers(0, len(lps) - 1))]
    else:
        lps = [*lps, -(draw(st.integers(1, 30)) / 8)]
    item["generation_log_probs"] = lps
    return RolloutStatus.INVALID, turn, tuple(lps), f"{how}: {len(lps)} logprobs"


def _bad_entry(
    draw: st.DrawFn, response: dict[str, Any], episode: Episode, fields: tuple[str, ...]
) -> _Broken:
    """One entry of one turn's array in ``fields`` replaced by a value of the wrong type."""
    turn = draw(st.integers(0, episode.num_turns - 1))
    choices = [f for f in fields if f != "prompt_token_ids" or turn == 0]
    field = draw(st.sampled_from(choices))
    values = _BAD_LOGPROBS if field == "generation_log_probs" else _BAD_TOKENS
    item = _model_items(response)[turn]
    position = draw(st.integers(0, len(item[field]) - 1))
    value = draw(values)
    item[field][position] = value
    return RolloutStatus.INVALID, turn, None, f"{field}[{position}] of turn {turn} is {value!r}"


def _break(
    draw: st.DrawFn, kind: FailureKind, response: dict[str, Any], episode: Episode
) -> _Broken:
    """Turn ``response`` (a copy of ``episode``'s) into failure shape ``kind``."""
    if kind == "agent_error":
        response["error"] = draw(st.sampled_from(["model server timed out", "HTTP 500: boom"]))
        return RolloutStatus.AGENT_ERROR, None, None, ""
    if kind == "empty_output":
        response["response"]["output"] = []
        return RolloutStatus.EMPTY, None, None, ""
    if kind == "no_answer":
        response["response"]["output"] = [
            {"type": "reasoning", "id": "rs_0", "summary": []},
            {"type": "function_call_output", "call_id": "c0", "output": "{}"},
        ]
        return RolloutStatus.EMPTY, None, None, ""
    if kind == "no_token_ids":
        for item in _model_items(response):
            for field in _TOKEN_FIELDS:
                del item[field]
        return RolloutStatus.NO_TOKEN_IDS, None, None, ""
    if kind == "logprob_count_mismatch":
        return _miscount(draw, response, episode)
    if kind == "mask_sample":
        response["mask_sample"] = True
        return RolloutStatus.MASKED, None, None, ""
    if kind == "invalid_reward":
        response["reward"] = value = draw(_BAD_REWARDS)
        return RolloutStatus.INVALID, None, None, f"reward is {value!r}"
    if kind == "invalid_logprobs":
        return _bad_entry(draw, response, episode, ("generation_log_probs",))
    return _bad_entry(draw, response, episode, ("prompt_token_ids", "generation_token_ids"))


@st.composite
def failures(
    draw: st.DrawFn, *, kinds: tuple[FailureKind, ...] = FAILURE_KINDS, max_turns: int = 4
) -> FailureCase:
    """A failure shape of one of ``kinds``, built from a contiguous episode."""
    episode = draw(episodes(max_turns=max_turns))
    response = copy.deepcopy(episode.response)
    kind = draw(st.sampled_from(kinds))
    status, turn, sent, detail = _break(draw, kind, response, episode)
    return FailureCase(
        response=response,
        kind=kind,
        status=status,
        episode=episode,
        turn=turn,
        logprobs=sent,
        detail=detail,
    )


_KEYS = [
    "response",
    "output",
    "reward",
    "error",
    "type",
    "mask_sample",
    "reward_components",
    "prompt_token_ids",
    "generation_token_ids",
    "generation_log_probs",
    "content",
    "text",
    "function_call",
    "message",
    "output_text",
]


def json_values(max_leaves: int = 30) -> st.SearchStrategy[Any]:
    """Arbitrary JSON-like values (what a broken server might send), keyed mostly by the
    field names of a ``/run`` result."""
    scalars = (
        st.none()
        | st.booleans()
        | st.integers(min_value=-(2**70), max_value=2**70)
        | st.floats()
        | st.text(max_size=8)
    )
    keys = st.sampled_from(_KEYS) | st.text(max_size=4)
    return st.recursive(
        scalars,
        lambda children: (
            st.lists(children, max_size=4) | st.dictionaries(keys, children, max_size=4)
        ),
        max_leaves=max_leaves,
    )


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [prefix]
    if isinstance(value, dict):
        for key, child in value.items():
            found += _paths(child, (*prefix, key))
    elif isinstance(value, list):
        for index, child in enumerate(value):
            found += _paths(child, (*prefix, index))
    return found


@st.composite
def mangled_responses(draw: st.DrawFn, *, max_turns: int = 3, max_edits: int = 3) -> Any:
    """A valid (possibly drifting) episode with 1..``max_edits`` of its subtrees replaced by
    arbitrary JSON: wrong types, missing lists, junk where tokens belong."""
    response: Any = copy.deepcopy(draw(episodes(drift=True, max_turns=max_turns)).response)
    for _ in range(draw(st.integers(1, max_edits))):
        path = draw(st.sampled_from(_paths(response)))
        junk = draw(json_values(max_leaves=6))
        if not path:
            response = junk
            continue
        parent = response
        try:
            for step in path[:-1]:
                parent = parent[step]
            parent[path[-1]] = junk
        except (KeyError, IndexError, TypeError):
            continue
    return response


@st.composite
def raw_responses(draw: st.DrawFn, *, max_turns: int = 3) -> bytes:
    """Raw ``/run`` bodies: valid JSON of an episode or a mangled one, the same cut short
    (a truncated body), or arbitrary bytes."""
    kind = draw(st.sampled_from(["episode", "mangled", "truncated", "noise"]))
    if kind == "noise":
        return draw(st.binary(max_size=200))
    if kind == "mangled":
        value = draw(mangled_responses(max_turns=max_turns))
    else:
        value = draw(episodes(drift=True, max_turns=max_turns)).response
    body = json.dumps(value).encode()
    if kind == "truncated":
        body = body[: draw(st.integers(0, max(0, len(body) - 1)))]
    return body
