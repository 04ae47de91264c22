"""Per-token logprobs at a real vocabulary: the LM head in one pass against chunked, side by side.

For each vocabulary V, hidden size H and completion length T, a 2-layer Llama (random
weights, built in process) computes ``token_logprobs`` of one row (a 16-token prompt and a
T-token completion) and the backward pass of their sum, as a learner's step does, twice: with
the whole ``[1, T, V]`` logits at once (``head_chunk=None``) and through the head 1,024
positions at a time (the default). Each measurement runs in a fresh process, so its peak
resident memory (``ru_maxrss``) is its own; the table gives the peak above the process's
memory before the call (model, optimizer-free weights and inputs), and the wall time of the
call (forward and backward, after one warm-up call at T = 64).

A run whose memory passes ``--mem-cap-gb`` (an address-space limit, so it fails instead of
waking the kernel's OOM killer) is reported as "over the cap".

    .venv/bin/python benchmarks/bench_logprobs.py
    .venv/bin/python benchmarks/bench_logprobs.py --vocab 151669 --hidden 64 --tokens 1024 4096
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PROMPT = 16


def measure(vocab: int, hidden: int, tokens: int, chunked: bool, cap_gb: float) -> dict[str, float]:
    """One measurement, in this process (run by ``--one``)."""
    cap = int(cap_gb * 2**30)
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from nemogym_sdk import Rollout, RolloutStatus, collate
    from nemogym_sdk.adapters.torch import token_logprobs

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=2,
        num_attention_heads=max(1, hidden // 64),
        num_key_value_heads=max(1, hidden // 64),
        max_position_embeddings=PROMPT + tokens + 8,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config).float()

    def batch(n: int) -> object:
        ids = torch.randint(0, vocab, (PROMPT + n,)).tolist()
        row = Rollout(
            prompt_ids=ids[:PROMPT],
            completion_ids=ids[PROMPT:],
            env_mask=[1] * n,
            logprobs=[0.0] * n,
            reward=0.0,
            num_turns=1,
            status=RolloutStatus.OK,
        )
        return collate([row], pad_token_id=0)

    head_chunk = 1024 if chunked else None

    def step(n: int) -> float:
        data = batch(n)
        began = time.perf_counter()
        token_logprobs(model, data, head_chunk=head_chunk).sum().backward()  # type: ignore[arg-type]
        model.zero_grad(set_to_none=True)
        return time.perf_counter() - began

    step(64)
    before = _rss_bytes()
    seconds = step(tokens)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"seconds": seconds, "peak_gb": peak / 2**30, "above_gb": (peak - before) / 2**30}


def _rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def run_one(
    vocab: int, hidden: int, tokens: int, chunked: bool, cap_gb: float
) -> dict[str, object]:
    argv = [sys.executable, __file__, "--one", str(vocab), str(hidden), str(tokens)]
    argv += ["chunked" if chunked else "whole", "--mem-cap-gb", str(cap_gb)]
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE"}
    done = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        over = "MemoryError" in done.stderr or "DefaultCPUAllocator" in done.stderr
        return {"error": "over the cap" if over else done.stderr.strip().splitlines()[-1]}
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def _cell(result: dict[str, object], key: str, fmt: str) -> str:
    return str(result["error"]) if "error" in result else format(result[key], fmt)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--vocab", type=int, nargs="+", default=[151669, 248044])
    parser.add_argument("--hidden", type=int, nargs="+", default=[64, 512])
    parser.add_argument("--tokens", type=int, nargs="+", default=[1024, 4096, 16384])
    parser.add_argument("--mem-cap-gb", type=float, default=14.0)
    parser.add_argument("--one", nargs=4, metavar=("V", "H", "T", "MODE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        vocab, hidden, tokens, mode = args.one
        result = measure(int(vocab), int(hidden), int(tokens), mode == "chunked", args.mem_cap_gb)
        print(json.dumps(result))
        return
    print("| V | H | T | one pass: s | chunked: s | time ratio | one pass: GB above | "
          "chunked: GB above | memory ratio |")  # fmt: skip
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for vocab in args.vocab:
        for hidden in args.hidden:
            for tokens in args.tokens:
                whole = run_one(vocab, hidden, tokens, False, args.mem_cap_gb)
                chunked = run_one(vocab, hidden, tokens, True, args.mem_cap_gb)
                both = "error" not in whole and "error" not in chunked
                ratio_t = f"{chunked['seconds'] / whole['seconds']:.2f}" if both else ""  # type: ignore[operator]
                ratio_m = f"1/{whole['above_gb'] / chunked['above_gb']:.1f}" if both else ""  # type: ignore[operator]
                print(
                    f"| {vocab:,} | {hidden} | {tokens:,} | {_cell(whole, 'seconds', '.2f')} | "
                    f"{_cell(chunked, 'seconds', '.2f')} | {ratio_t} | "
                    f"{_cell(whole, 'above_gb', '.2f')} | {_cell(chunked, 'above_gb', '.2f')} | "
                    f"{ratio_m} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
