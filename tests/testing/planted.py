"""Planted bugs: a correct ``/run`` parser and copies of it with one real-world bug each.

``parse(response, eos)`` is a plain-Python parser in the seed's dict shape (``prompt_ids``,
``completion_ids``, ``env_mask``, ``logprobs``, ``reward``, ``num_turns``; the one-token
``[eos]`` sample with ``env_mask [0]`` for anything it refuses), written for these tests
and independent of the SDK's parser. It takes decoded JSON or raw bytes. ``BUGS`` names
the bugs that can be planted in it, each the way real parsers get it wrong, with the
checks that must catch it; ``planted(*bugs)`` wires it as the docs show::

    check_all(Parser(parse=lambda response: parse(response, EOS), name="mine"))

The kit's mutation score is ``BUGS`` caught (``tests/testing/test_mutation_score.py``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from typing import Any

import attrs

from nemogym_sdk.testing import Parser

EOS = 2
Turn = tuple[list[int], list[int], list[float]]


@attrs.frozen(kw_only=True)
class Bug:
    """One planted bug and what must catch it."""

    does: str
    """What the buggy parser does, in words (the docs' mutation table)."""
    caught_by: tuple[str, ...]
    """The checks that must fail (every time)."""
    also: tuple[str, ...] = ()
    """Checks that may also fail, depending on what Hypothesis draws."""


BUGS: dict[str, Bug] = {
    "drops_env_tokens": Bug(
        does="loses the tool output between turns",
        caught_by=("stitching",),
        # later turns shift onto the lost tokens' places, policy tokens onto env positions
        also=("env_tokens_not_trained", "policy_tokens_trained"),
    ),
    "trains_env_tokens": Bug(
        does="marks the tool output as policy tokens", caught_by=("env_tokens_not_trained",)
    ),
    "masks_last_token": Bug(
        does="masks each generation's last (stop) token out of the loss",
        caught_by=("policy_tokens_trained",),
        also=("stitching",),  # one-token generations: nothing left to train
    ),
    "shifts_logprobs": Bug(
        does="attaches each logprob to the next token (off by one)", caught_by=("logprobs",)
    ),
    "pads_logprobs": Bug(
        does="pads a short logprob list with 0.0, cuts a long one",
        caught_by=("logprob_count_mismatch_not_trained",),
    ),
    "reward_read_as_zero": Bug(
        does="reads the reward from `response.response`, where it is absent: always 0.0",
        caught_by=("reward", "failures_not_trained[invalid_reward]"),
    ),
    "reward_negated": Bug(
        does="negates the reward (a cost read as a reward)", caught_by=("reward",)
    ),
    "int_reward_read_as_zero": Bug(
        does="keeps float rewards only: an integer reward (JSON `1`) becomes 0.0",
        caught_by=("reward",),
    ),
    "int_reward_drops_sample": Bug(
        does="refuses a result whose reward is an integer, as if it were malformed",
        caught_by=("stitching", "policy_tokens_trained"),
    ),
    "counts_output_items": Bug(
        does="counts every output item (tool outputs, reasoning) as a turn",
        caught_by=("num_turns",),
    ),
    "omits_num_turns": Bug(does="returns no `num_turns`", caught_by=("num_turns",)),
    "skips_prefix_check": Bug(
        does="takes `prompt[len(history):]` as tool output without comparing the history",
        caught_by=(
            "drift_rejected[retokenized]",
            "drift_rejected[stripped]",
            "drift_rejected[rerendered]",
        ),
    ),
    "ignores_agent_error": Bug(
        does="parses the output of a result that has an `error` field",
        caught_by=("failures_not_trained[agent_error]",),
    ),
    "ignores_mask_sample": Bug(
        does="trains a result that has `mask_sample: true`",
        caught_by=("failures_not_trained[mask_sample]",),
    ),
    "casts_reward": Bug(
        does='`float(reward)`: trains NaN, `true` and `"1.0"` rewards, crashes on `null`',
        caught_by=("failures_not_trained[invalid_reward]",),
        also=("never_crashes[dicts]", "never_crashes[bytes]"),
    ),
    "casts_logprobs": Bug(
        does="`float()` of each logprob: trains NaN and `true`, crashes on `null`",
        caught_by=("failures_not_trained[invalid_logprobs]",),
        also=("never_crashes[dicts]", "never_crashes[bytes]"),
    ),
    "casts_token_ids": Bug(
        does='`int()` of each token id: trains `"5"`, `5.5` and `true` as tokens',
        caught_by=("failures_not_trained[invalid_token_ids]",),
        also=("never_crashes[dicts]", "never_crashes[bytes]"),
    ),
    "trusts_input": Bug(
        does="indexes the JSON without looking at its types or counts",
        caught_by=(
            "logprob_count_mismatch_not_trained",
            "failures_not_trained[invalid_reward]",
            "failures_not_trained[invalid_logprobs]",
            "failures_not_trained[invalid_token_ids]",
            "never_crashes[dicts]",
            "never_crashes[bytes]",
        ),
    ),
    "crashes_on_bytes": Bug(
        does="`json.loads` of a raw body, unguarded: a truncated body raises",
        caught_by=("never_crashes[bytes]",),
    ),
}
"""Every planted bug, by name."""


def _defaults(eos: int) -> dict[str, Any]:
    return {
        "prompt_ids": [eos],
        "completion_ids": [eos],
        "env_mask": [0],
        "logprobs": [0.0],
        "reward": 0.0,
        "num_turns": 0,
    }


def _decode(response: Any, bugs: frozenset[str]) -> Any:
    if not isinstance(response, bytes | bytearray):
        return response
    if "crashes_on_bytes" in bugs:
        return json.loads(response)
    try:
        return json.loads(response)
    except ValueError:
        return None


def _reward(response: dict[str, Any], bugs: frozenset[str]) -> float | None:
    value = response.get("reward", 0.0)
    if "reward_read_as_zero" in bugs:
        value = response["response"].get("reward", 0.0)
    if "casts_reward" in bugs:
        return float(value)
    if type(value) not in (int, float) or not math.isfinite(value):
        return None
    if "int_reward_read_as_zero" in bugs and type(value) is int:
        return 0.0
    if "int_reward_drops_sample" in bugs and type(value) is int:
        return None
    return -float(value) if "reward_negated" in bugs else float(value)


def _output(response: Any, bugs: frozenset[str]) -> list[Any] | None:
    """``response.output``, or None when the result is refused as a whole."""
    if "trusts_input" not in bugs and not isinstance(response, dict):
        return None
    if response.get("error") is not None and "ignores_agent_error" not in bugs:
        return None
    if response.get("mask_sample") is True and "ignores_mask_sample" not in bugs:
        return None
    if "trusts_input" in bugs:
        output: list[Any] = response["response"]["output"]
        return output
    body = response.get("response")
    output = body.get("output") if isinstance(body, dict) else None
    return output if isinstance(output, list) else None


def _ints(value: Any, bugs: frozenset[str]) -> list[int] | None:
    if "casts_token_ids" in bugs:
        return [int(t) for t in value]
    if isinstance(value, list) and all(type(t) is int and -(2**63) <= t < 2**63 for t in value):
        return value
    return None


def _floats(value: Any, bugs: frozenset[str]) -> list[float] | None:
    if "casts_logprobs" in bugs:
        return [float(v) for v in value]
    if isinstance(value, list) and all(type(v) in (int, float) and math.isfinite(v) for v in value):
        return [float(v) for v in value]
    return None


def _turns(output: list[Any], bugs: frozenset[str]) -> list[Turn] | None:
    """Each model turn's prompt, generation and logprobs; None when one is malformed."""
    turns: list[Turn] = []
    for item in output:
        if "trusts_input" not in bugs and not isinstance(item, dict):
            continue
        if not item.get("generation_token_ids"):
            continue
        prompt = _ints(item.get("prompt_token_ids"), bugs)
        generation = _ints(item.get("generation_token_ids"), bugs)
        lps = _floats(item.get("generation_log_probs", []), bugs)
        if prompt is None or generation is None or lps is None:
            return None
        if len(lps) != len(generation):
            if "pads_logprobs" not in bugs:
                return None
            lps = (lps + [0.0] * len(generation))[: len(generation)]
        turns.append((prompt, generation, lps))
    return turns


def _stitch(turns: list[Turn], bugs: frozenset[str]) -> dict[str, Any] | None:
    """The seed dict's token fields of ``turns``, or None when the history drifted."""
    completion: list[int] = []
    mask: list[int] = []
    logprobs: list[float] = []
    history = list(turns[0][0])
    for number, (prompt, generation, lps) in enumerate(turns):
        if number:
            if prompt[: len(history)] != history and "skips_prefix_check" not in bugs:
                return None
            delta = [] if "drops_env_tokens" in bugs else list(prompt[len(history) :])
            completion += delta
            mask += [1 if "trains_env_tokens" in bugs else 0] * len(delta)
            logprobs += [0.0] * len(delta)
        completion += generation
        mask += [1] * len(generation)
        if "masks_last_token" in bugs:
            mask[-1] = 0
        logprobs += [0.0, *lps[:-1]] if "shifts_logprobs" in bugs else lps
        history = list(prompt) + list(generation)
    return {
        "prompt_ids": list(turns[0][0]),
        "completion_ids": completion,
        "env_mask": mask,
        "logprobs": logprobs,
    }


def parse(response: Any, eos: int, bugs: Iterable[str] = ()) -> dict[str, Any]:
    """The seed dict of one ``/run`` result (decoded or raw bytes), with ``bugs`` planted."""
    planted = frozenset(bugs)
    unknown = planted - set(BUGS)
    if unknown:
        raise ValueError(f"no such planted bug: {sorted(unknown)}")
    if "trusts_input" in planted:
        planted |= {"casts_reward", "casts_logprobs", "casts_token_ids", "pads_logprobs"}
    decoded = _decode(response, planted)
    output = _output(decoded, planted)
    if output is None:
        return _defaults(eos)
    reward = _reward(decoded, planted)
    turns = _turns(output, planted)
    if reward is None or not turns:
        return _defaults(eos)
    sample = _stitch(turns, planted)
    if sample is None:
        return _defaults(eos)
    sample["reward"] = reward
    if "omits_num_turns" not in planted:
        sample["num_turns"] = len(output) if "counts_output_items" in planted else len(turns)
    return sample


def planted(*bugs: str, differences: Mapping[str, str] | None = None) -> Parser:
    """``parse`` with ``bugs`` as a ``Parser`` (fed dicts and raw bytes; the seed dict is
    read by the default adapter)."""
    return Parser(
        parse=lambda response: parse(response, EOS, bugs),
        takes_bytes=True,
        name=f"planted parser ({' + '.join(bugs) or 'correct'})",
        differences=dict(differences or {}),
    )
