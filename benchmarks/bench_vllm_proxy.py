"""Tokens/s through the vLLM proxy (``nemogym_sdk.serve --backend vllm``) vs vLLM directly.

One real vLLM server (``start_vllm``, the SDK's tiny model) and one proxy in front of it. The
same requests go, interleaved round by round, to:

  (a) proxy   ``POST /v1/chat/completions`` (messages; the proxy renders, splices and calls
              vLLM's ``/v1/completions`` with the token ids);
  (b) vLLM    ``POST /v1/chat/completions`` with the same messages (vLLM renders);
  (c) vLLM    ``POST /v1/completions`` with the token-id prompts the proxy sends (the floor).

Every request asks for logprobs and token ids (what NeMo Gym's ``vllm_model`` asks for),
``max_tokens`` fixed with ``ignore_eos`` so every answer has exactly that many tokens,
temperature 1 and a per-request seed. Before timing it checks that (a) and (c) return the same
tokens for the same seed. Reports median tokens/s per variant, the ratios, and the CPU time each
process spent per generated token (vLLM with its engine and worker processes, the proxy, this
client), which separates what the proxy costs from how fast vLLM happened to run.

    .venv/bin/python benchmarks/bench_vllm_proxy.py --requests 64 --concurrency 8 --max-tokens 64
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import psutil

from nemogym_sdk.gym import start_serve, start_vllm
from nemogym_sdk.serve.template import ChatTemplate
from nemogym_sdk.serve.tiny import save_tiny

SERVED = "nemogym-tiny"


def _messages(index: int) -> list[dict[str, str]]:
    return [
        {"role": "system", "content": "Reply with lowercase letters only."},
        {"role": "user", "content": f"Round {index % 3 + 1} of 3. Word: w{index:04d}. Reply."},
    ]


def _chat_body(index: int, max_tokens: int) -> dict[str, Any]:
    return {
        "model": SERVED,
        "messages": _messages(index),
        "max_tokens": max_tokens,
        "temperature": 1.0,
        "seed": index,
        "ignore_eos": True,
        "logprobs": True,
        "top_logprobs": 0,
        "return_tokens_as_token_ids": True,
        "return_token_ids": True,
    }


def _completion_body(prompt: list[int], index: int, max_tokens: int) -> dict[str, Any]:
    return {
        "model": SERVED,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 1.0,
        "top_p": 1.0,
        "seed": index,
        "ignore_eos": True,
        "logprobs": 0,
        "return_token_ids": True,
        "return_tokens_as_token_ids": True,
    }


async def _run(
    session: aiohttp.ClientSession, url: str, bodies: list[dict[str, Any]], concurrency: int
) -> tuple[float, list[list[int]]]:
    """Send ``bodies`` with at most ``concurrency`` in flight; wall seconds and token ids."""
    gate = asyncio.Semaphore(concurrency)
    out: list[list[int]] = [[] for _ in bodies]

    async def one(i: int, body: dict[str, Any]) -> None:
        async with gate, session.post(url, json=body) as response:
            data = await response.json()
            if response.status != 200:
                raise RuntimeError(f"{url}: {response.status} {data}")
            out[i] = list(data["choices"][0]["token_ids"])

    began = time.perf_counter()
    await asyncio.gather(*(one(i, b) for i, b in enumerate(bodies)))
    return time.perf_counter() - began, out


def _cpu(pids: dict[str, int]) -> dict[str, float]:
    """CPU seconds (user + system) used so far by each process (vLLM: with its children)."""
    out: dict[str, float] = {}
    for name, pid in pids.items():
        root = psutil.Process(pid)
        total = 0.0
        for proc in [root, *(root.children(recursive=True) if name == "vllm" else [])]:
            try:
                times = proc.cpu_times()
            except psutil.NoSuchProcess:
                continue
            total += times.user + times.system
        out[name] = total
    return out


async def _bench(
    args: argparse.Namespace, vllm_url: str, proxy_url: str, model: Path, pids: dict[str, int]
) -> None:
    template = ChatTemplate.from_pretrained(model)
    prompts = [
        template.render(_messages(i), tools=None, add_generation_prompt=True,
                        continue_final_message=False)
        for i in range(args.requests)
    ]  # fmt: skip
    chats = [_chat_body(i, args.max_tokens) for i in range(args.requests)]
    completions = [_completion_body(p, i, args.max_tokens) for i, p in enumerate(prompts)]
    variants = {
        "(a) proxy chat": (f"{proxy_url}/chat/completions", chats),
        "(b) vLLM chat": (f"{vllm_url}/chat/completions", chats),
        "(c) vLLM completions": (f"{vllm_url}/completions", completions),
    }
    timeout = aiohttp.ClientTimeout(total=600)
    connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=3.0)  # uvicorn closes at 5 s
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        # warm-up, and the same tokens through the proxy as from vLLM's completions
        _, via_proxy = await _run(session, *variants["(a) proxy chat"], args.concurrency)
        _, direct = await _run(session, *variants["(c) vLLM completions"], args.concurrency)
        await _run(session, *variants["(b) vLLM chat"], args.concurrency)
        same = sum(a == c for a, c in zip(via_proxy, direct, strict=True))
        print(f"same tokens via proxy and vLLM completions (same seed): {same}/{len(direct)}")
        rates: dict[str, list[float]] = {name: [] for name in variants}
        cpu: dict[str, dict[str, float]] = {name: dict.fromkeys(pids, 0.0) for name in variants}
        tokens: dict[str, int] = dict.fromkeys(variants, 0)
        for _ in range(args.rounds):
            for name, (url, bodies) in variants.items():
                before = _cpu(pids)
                seconds, ids = await _run(session, url, bodies, args.concurrency)
                after = _cpu(pids)
                for proc in pids:
                    cpu[name][proc] += after[proc] - before[proc]
                tokens[name] += sum(len(t) for t in ids)
                rates[name].append(sum(len(t) for t in ids) / seconds)
    medians = {name: statistics.median(values) for name, values in rates.items()}
    print(
        f"requests={args.requests} concurrency={args.concurrency} "
        f"max_tokens={args.max_tokens} rounds={args.rounds}"
    )
    for name, value in medians.items():
        spread = ", ".join(f"{v:.0f}" for v in rates[name])
        print(f"  {name:22s} {value:8.0f} tokens/s   (rounds: {spread})")
    print("  CPU ms per generated token, by process (vLLM: its whole tree):")
    for name in variants:
        parts = ", ".join(f"{proc} {1000 * cpu[name][proc] / tokens[name]:.2f}" for proc in pids)
        print(f"    {name:22s} {parts}")
    proxy = medians["(a) proxy chat"]
    print(f"  proxy / vLLM chat        {proxy / medians['(b) vLLM chat']:.3f}")
    print(f"  proxy / vLLM completions {proxy / medians['(c) vLLM completions']:.3f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model = save_tiny(Path(tmp) / "tiny", 0)
        with start_vllm(model, served_model_name=SERVED, log_path=Path(tmp) / "vllm.log") as vllm:
            extra = ["--backend", "vllm", "--vllm-url", vllm.base_url, "--log-level", "WARNING"]
            with start_serve(
                mode="sample",
                logprobs_mode="raw_logprobs",
                model=model,
                served_model_name=SERVED,
                extra_args=extra,
                log_path=Path(tmp) / "proxy.log",
            ) as proxy:
                pids = {"vllm": vllm.pid, "proxy": proxy.pid, "client": os.getpid()}
                asyncio.run(_bench(args, vllm.base_url, proxy.base_url, model, pids))
    return 0


if __name__ == "__main__":
    sys.exit(main())
