"""Baseline for bench_parse.py: a straightforward pure-Python version of the seed algorithm.

Stdlib ``json`` decode, Python lists, the seed's turn walk (no prefix check, logprobs
padded or cut to the token count), and padding into nested lists. This is what an
integration written the obvious way does; it is kept here only to measure against.
"""

from __future__ import annotations

import json
from typing import Any


def parse(raw: bytes, eos: int) -> dict[str, Any]:
    """One /run result (bytes) -> the seed's dict of lists."""
    response = json.loads(raw)
    default = {
        "prompt_ids": [eos],
        "completion_ids": [eos],
        "env_mask": [0],
        "logprobs": [0.0],
        "reward": 0.0,
        "num_turns": 0,
    }
    if not isinstance(response, dict) or "error" in response:
        return default
    output = response.get("response", {}).get("output", [])
    reward = float(response.get("reward", 0.0))
    if not output:
        return default | {"reward": reward}
    answered = any(
        item.get("type") == "function_call"
        or (
            item.get("type") == "message"
            and any(
                part.get("type") == "output_text" and part.get("text", "").strip()
                for part in item.get("content") or []
            )
        )
        for item in output
    )
    if not answered:  # the seed's validity gate
        return default | {"reward": reward}
    prompt: list[int] = []
    completion: list[int] = []
    mask: list[int] = []
    logprobs: list[float] = []
    seen: list[int] = []
    turns = 0
    for item in output:
        generation = item.get("generation_token_ids") or []
        if not generation:
            continue
        turn_prompt = item.get("prompt_token_ids") or []
        turn_logprobs = list(item.get("generation_log_probs") or [])
        if turns == 0:
            prompt = list(turn_prompt)
        elif len(turn_prompt) > len(seen):
            extra = turn_prompt[len(seen) :]
            completion += extra
            mask += [0] * len(extra)
            logprobs += [0.0] * len(extra)
        turn_logprobs = (turn_logprobs + [0.0] * len(generation))[: len(generation)]
        completion += generation
        mask += [1] * len(generation)
        logprobs += turn_logprobs
        seen = list(turn_prompt) + list(generation)
        turns += 1
    if turns == 0:
        return default
    return {
        "prompt_ids": prompt,
        "completion_ids": completion,
        "env_mask": mask,
        "logprobs": logprobs,
        "reward": reward,
        "num_turns": turns,
    }


def collate(samples: list[dict[str, Any]], pad: int) -> dict[str, list[Any]]:
    """Left-pad prompts, right-pad completions, into nested Python lists."""
    p = max(len(s["prompt_ids"]) for s in samples)
    t = max(len(s["completion_ids"]) for s in samples)
    out: dict[str, list[Any]] = {
        k: []
        for k in (
            "prompt_ids",
            "prompt_mask",
            "completion_ids",
            "completion_mask",
            "env_mask",
            "logprobs",
            "rewards",
        )
    }
    for s in samples:
        n_p, n_c = len(s["prompt_ids"]), len(s["completion_ids"])
        out["prompt_ids"].append([pad] * (p - n_p) + s["prompt_ids"])
        out["prompt_mask"].append([0] * (p - n_p) + [1] * n_p)
        out["completion_ids"].append(s["completion_ids"] + [pad] * (t - n_c))
        out["completion_mask"].append([1] * n_c + [0] * (t - n_c))
        out["env_mask"].append(s["env_mask"] + [1] * (t - n_c))
        out["logprobs"].append(s["logprobs"] + [0.0] * (t - n_c))
        out["rewards"].append(s["reward"])
    return out
