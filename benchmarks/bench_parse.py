"""Parse + collate throughput: nemogym_sdk vs an orjson decode vs the pure-Python seed.

Builds realistic NeMo Gym /run results as JSON bytes (8 model turns, tool calls and
tool outputs between them, prompts growing to several thousand tokens, every turn
repeating the whole history in prompt_token_ids) and times, in one run:

  (a) orjson.loads of every response (decode only, no training data built)
  (b) nemogym_sdk: parse_agent_response(bytes) for every response, then collate
  (c) baseline_seed: json.loads + the seed algorithm in pure Python + list padding

Usage: python benchmarks/bench_parse.py [--rollouts 256 2048] [--turns 8] [--repeats 7]
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import baseline_seed

from nemogym_sdk import collate, parse_agent_response

EOS = 2
VOCAB = 151_000


def make_response(rng: np.random.Generator, turns: int) -> bytes:
    """One realistic multi-turn /run result, serialized like a JSON HTTP body."""
    history = rng.integers(3, VOCAB, size=int(rng.integers(1200, 1800))).tolist()
    output: list[dict[str, Any]] = []
    for turn in range(turns):
        generation = rng.integers(3, VOCAB, size=int(rng.integers(80, 220))).tolist()
        logprobs = np.round(-rng.exponential(0.6, size=len(generation)), 8).tolist()
        last = turn == turns - 1
        item: dict[str, Any] = (
            {
                "id": f"msg_{turn}",
                "type": "message",
                "role": "assistant",
                "status": "completed",
                "content": [
                    {"type": "output_text", "text": "The answer is 42.", "annotations": []}
                ],
            }
            if last
            else {
                "id": f"fc_{turn}",
                "type": "function_call",
                "call_id": f"call_{turn}",
                "name": "search",
                "arguments": '{"query": "weather in sf"}',
                "status": "completed",
            }
        )
        item |= {
            "prompt_token_ids": history,
            "generation_token_ids": generation,
            "generation_log_probs": logprobs,
            "routed_experts": None,
        }
        output.append(item)
        history = history + generation
        if not last:
            tool = rng.integers(3, VOCAB, size=int(rng.integers(150, 300))).tolist()
            output.append(
                {
                    "type": "function_call_output",
                    "call_id": f"call_{turn}",
                    "output": json.dumps({"result": "x" * 400}),
                }
            )
            history = history + tool
    body = {
        "responses_create_params": {
            "input": [{"role": "user", "content": "What is the weather?"}],
            "tools": [{"type": "function", "name": "search"}],
        },
        "response": {
            "id": "resp_1",
            "object": "response",
            "model": "policy",
            "output": output,
            "usage": {"input_tokens": len(history), "output_tokens": 1200},
        },
        "reward": float(rng.random()),
        "mask_sample": False,
    }
    return orjson.dumps(body)


def timed(variants: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    """Median wall time of each variant, interleaving the variants within every repeat
    (so a machine that speeds up or slows down affects all of them alike); gc off while
    timing."""
    times: dict[str, list[float]] = {name: [] for name in variants}
    names = list(variants)
    for repeat in range(repeats):
        order = names[repeat % len(names) :] + names[: repeat % len(names)]
        for name in order:
            gc.collect()
            gc.disable()
            start = time.perf_counter()
            variants[name]()
            times[name].append(time.perf_counter() - start)
            gc.enable()
    return {name: statistics.median(values) for name, values in times.items()}


def run(n: int, turns: int, repeats: int) -> dict[str, float]:
    rng = np.random.default_rng(0)
    responses = [make_response(rng, turns) for _ in range(n)]
    megabytes = sum(len(r) for r in responses) / 1e6

    def ours() -> None:
        collate([parse_agent_response(r, EOS) for r in responses], pad_token_id=0)

    def decode_only() -> None:
        for r in responses:
            orjson.loads(r)

    def seed() -> None:
        baseline_seed.collate([baseline_seed.parse(r, EOS) for r in responses], pad=0)

    # The two implementations agree on the training data before anything is timed.
    for raw in responses[:4]:
        mine = parse_agent_response(raw, EOS).to_dict()
        assert mine == baseline_seed.parse(raw, EOS), "implementations disagree"

    medians = timed({"orjson": decode_only, "ours": ours, "seed": seed}, repeats)
    return {
        "rollouts": n,
        "MB": megabytes,
        "orjson_s": medians["orjson"],
        "ours_s": medians["ours"],
        "seed_s": medians["seed"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, nargs="+", default=[256, 2048])
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    print(
        f"{'rollouts':>8} {'MB':>7} {'(a) orjson':>11} {'(b) ours':>9} {'(c) seed':>9} "
        f"{'c/b':>6} {'a/b':>6}"
    )
    for n in args.rollouts:
        r = run(n, args.turns, args.repeats)
        print(
            f"{n:>8} {r['MB']:>7.1f} {r['orjson_s']:>10.3f}s {r['ours_s']:>8.3f}s "
            f"{r['seed_s']:>8.3f}s {r['seed_s'] / r['ours_s']:>5.1f}x "
            f"{r['orjson_s'] / r['ours_s']:>5.1f}x"
        )


if __name__ == "__main__":
    main()
