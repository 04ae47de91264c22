"""Hypothesis strategies for ``/run`` results that must not become training samples.

``failures()`` draws the failure shapes NeMo Gym produces (an agent error, no output, no
token ids, a logprob count that differs from the token count, ``mask_sample``), each with
the ``RolloutStatus`` ``parse_agent_response`` gives it. ``json_values()``,
``mangled_responses()`` and ``raw_responses()`` feed the "never crashes" properties:
arbitrary JSON, valid episodes with subtrees replaced by junk of any type, and raw bytes
(valid JSON, truncated JSON, or noise).
"""

from __future__ import annotations

import copy
import json
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
]
FAILURE_KINDS: tuple[FailureKind, ...] = get_args(FailureKind)

_TOKEN_FIELDS = ("prompt_token_ids", "generation_token_ids", "generation_log_probs")


@attrs.frozen(kw_only=True)
class FailureCase:
    """A ``/run`` result that must not be trained on, and why."""

    response: dict[str, Any]
    kind: FailureKind
    status: RolloutStatus
    """The status ``parse_agent_response`` gives it."""
    episode: Episode
    """The well-formed episode the failure was made from."""
    turn: int | None = None
    """The model turn that was broken (``logprob_count_mismatch``)."""
    logprobs: tuple[float, ...] | None = None
    """That turn's ``generation_log_probs`` as sent (``None``: the field is absent)."""

    def describe(self) -> str:
        """The failure and its episode, drawn with tokens."""
        where = "" if self.turn is None else f" at turn {self.turn}, sent {self.logprobs}"
        return f"{self.kind}{where}\n{self.episode.describe()}"


def _model_items(response: dict[str, Any]) -> list[dict[str, Any]]:
    return [item for item in response["response"]["output"] if "generation_token_ids" in item]


@st.composite
def failures(
    draw: st.DrawFn, *, kinds: tuple[FailureKind, ...] = FAILURE_KINDS, max_turns: int = 4
) -> FailureCase:
    """A failure shape of one of ``kinds``, built from a contiguous episode."""
    episode = draw(episodes(max_turns=max_turns))
    response = copy.deepcopy(episode.response)
    kind = draw(st.sampled_from(kinds))
    turn: int | None = None
    sent: tuple[float, ...] | None = None
    if kind == "agent_error":
        response["error"] = draw(st.sampled_from(["model server timed out", "HTTP 500: boom"]))
        status = RolloutStatus.AGENT_ERROR
    elif kind == "empty_output":
        response["response"]["output"] = []
        status = RolloutStatus.EMPTY
    elif kind == "no_answer":
        response["response"]["output"] = [
            {"type": "reasoning", "id": "rs_0", "summary": []},
            {"type": "function_call_output", "call_id": "c0", "output": "{}"},
        ]
        status = RolloutStatus.EMPTY
    elif kind == "no_token_ids":
        for item in _model_items(response):
            for field in _TOKEN_FIELDS:
                del item[field]
        status = RolloutStatus.NO_TOKEN_IDS
    elif kind == "logprob_count_mismatch":
        turn = draw(st.integers(0, episode.num_turns - 1))
        item = _model_items(response)[turn]
        lps = list(item["generation_log_probs"])
        how = draw(st.sampled_from(["short", "long", "absent"]))
        if how == "short":
            lps = lps[: draw(st.integers(0, len(lps) - 1))]
        elif how == "long":
            lps = [*lps, -(draw(st.integers(1, 30)) / 8)]
        if how == "absent":
            del item["generation_log_probs"]
        else:
            item["generation_log_probs"] = lps
            sent = tuple(lps)
        status = RolloutStatus.INVALID
    else:
        response["mask_sample"] = True
        status = RolloutStatus.MASKED
    return FailureCase(
        response=response, kind=kind, status=status, episode=episode, turn=turn, logprobs=sent
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
