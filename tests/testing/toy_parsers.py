"""A small, independent ``/run`` parser with switchable flaws, to prove the checks can fail.

``toy_parse(response)`` is a correct parser in the seed's dict shape plus an ``ok`` flag
(plain Python, written for these tests). Each ``FLAWS`` entry breaks exactly one thing
the way real parsers do; ``PARSERS[flaw]`` wraps it for ``nemogym_sdk.testing.checks``.
"""

from __future__ import annotations

import math
from typing import Any

from nemogym_sdk.testing import Parser, Sample

FLAWS = (
    "drops_env_tokens",  # stitching: the tokens between turns are lost
    "pads_logprobs",  # logprobs: a short list is padded with 0.0, a long one cut
    "trains_env_tokens",  # env tokens: the tool output is marked as a policy token
    "skips_prefix_check",  # drift: prompt[len(history):] is taken on trust
    "ignores_mask_sample",  # failures: mask_sample: true is trained like any episode
    "trusts_input",  # crashes: indexes the JSON without looking at its types
)
FAIL: dict[str, Any] = {"ok": False}


def _ints(value: Any) -> list[int] | None:
    if isinstance(value, list) and all(type(t) is int for t in value):
        return value
    return None


def _floats(value: Any) -> list[float] | None:
    if isinstance(value, list) and all(type(v) in (int, float) and math.isfinite(v) for v in value):
        return [float(v) for v in value]
    return None


def _turns(output: list[Any], flaw: str | None) -> list[tuple[list[int], list[int], list[float]]]:
    turns = []
    for item in output:
        if flaw == "trusts_input":
            if item.get("generation_token_ids"):
                lps = item["generation_log_probs"]
                turns.append((item["prompt_token_ids"], item["generation_token_ids"], lps))
            continue
        if not isinstance(item, dict) or not item.get("generation_token_ids"):
            continue
        prompt = _ints(item.get("prompt_token_ids"))
        generation = _ints(item.get("generation_token_ids"))
        lps = _floats(item.get("generation_log_probs", []))
        if prompt is None or generation is None or lps is None:
            raise ValueError("bad turn")
        if len(lps) != len(generation):
            if flaw != "pads_logprobs":
                raise ValueError("logprob count")
            lps = (lps + [0.0] * len(generation))[: len(generation)]
        turns.append((prompt, generation, lps))
    return turns


def toy_parse(response: Any, flaw: str | None = None) -> dict[str, Any]:
    """The seed dict of ``response`` and ``ok``; ``flaw`` names one deliberate bug."""
    if flaw == "trusts_input":
        output = response["response"]["output"]
        reward = float(response["reward"])
    else:
        if not isinstance(response, dict) or "error" in response:
            return FAIL
        body = response.get("response")
        output = body.get("output") if isinstance(body, dict) else None
        reward = response.get("reward")
        if not isinstance(output, list) or type(reward) not in (int, float):
            return FAIL
        if not math.isfinite(reward):
            return FAIL
    if response.get("mask_sample") is True and flaw != "ignores_mask_sample":
        return FAIL
    try:
        turns = _turns(output, flaw)
    except ValueError:
        return FAIL
    if not turns:
        return FAIL
    prompt_ids = list(turns[0][0])
    completion: list[int] = []
    mask: list[int] = []
    logprobs: list[float] = []
    history = list(turns[0][0])
    for number, (prompt, generation, lps) in enumerate(turns):
        if number:
            if prompt[: len(history)] != history and flaw != "skips_prefix_check":
                return FAIL
            delta = [] if flaw == "drops_env_tokens" else list(prompt[len(history) :])
            completion += delta
            mask += [1 if flaw == "trains_env_tokens" else 0] * len(delta)
            logprobs += [0.0] * len(delta)
        completion += generation
        mask += [1] * len(generation)
        logprobs += lps
        history = list(prompt) + list(generation)
    return {
        "ok": True,
        "prompt_ids": prompt_ids,
        "completion_ids": completion,
        "env_mask": mask,
        "logprobs": logprobs,
        "reward": float(reward),
    }


def toy_samples(output: dict[str, Any]) -> list[Sample]:
    """Adapter: one sample when ``ok``, none otherwise."""
    if not output["ok"]:
        return []
    return [
        Sample(
            prompt_ids=tuple(output["prompt_ids"]),
            completion_ids=tuple(output["completion_ids"]),
            train_mask=tuple(output["env_mask"]),
            logprobs=tuple(output["logprobs"]),
            reward=output["reward"],
        )
    ]


def toy_parser(flaw: str | None = None) -> Parser:
    """The toy parser with ``flaw`` (``None``: the correct one) as a ``Parser``."""
    return Parser(
        parse=lambda response: toy_parse(response, flaw),
        samples=toy_samples,
        name=f"toy parser ({flaw or 'correct'})",
    )
