"""Sampler tokens generated after the client gives up on episodes, with and without the abort.

Real NeMo Gym (``target_chars``: three rounds, a model turn each) against the CPU sampler
(``nemogym_sdk.serve``, sample mode, the tiny model), every turn asking for ``--tokens``
tokens (``ignore_eos``). ``--episodes`` episodes are played at once and abandoned after
``--wait`` seconds (the client's deadline). NeMo Gym's agent plays on after the client has
gone; the sampler's own counter (``GET /metrics``, ``nemogym_serve_generation_tokens_total``)
says what that costs:

- ``before``: no abort (the episodes carry ids only so the run can stop them at the end);
- ``after``: ``AgentClient(sampler_url=...)`` aborts each one it gives up on.

Reported per mode: tokens generated while the client waited, tokens generated after it gave
up (until the sampler is idle for 2 s, or ``--cap`` seconds), and the seconds the sampler
kept generating for nobody.

    .venv/bin/python benchmarks/bench_abandon.py
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import requests

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from nemogym_sdk import AgentClient, RetryPolicy, RolloutStatus, TaskRow, Timeouts
from nemogym_sdk.data import read_rows
from nemogym_sdk.gym import GymStack, find_gym_venv, start_serve
from nemogym_sdk.wire import RESPONSES_CREATE_PARAMS, with_episode

EOS = 257


def tokens(root: str) -> int:
    text = requests.get(f"{root}/metrics", timeout=10).text
    line = next(x for x in text.splitlines() if x.startswith("nemogym_serve_generation_tokens"))
    return int(line.split()[1])


def idle(root: str, cap: float, quiet: float = 2.0) -> tuple[int, float]:
    """Wait until the counter has not moved for ``quiet`` seconds (``cap`` at most); the
    count then, and the seconds until it last moved."""
    began, last, count = time.monotonic(), time.monotonic(), tokens(root)
    while time.monotonic() - last < quiet and time.monotonic() - began < cap:
        time.sleep(0.1)
        now = tokens(root)
        if now != count:
            count, last = now, time.monotonic()
    return count, last - began


def long_rows(path: Path, n: int, max_tokens: int, tag: str) -> list[TaskRow]:
    rows = []
    for row in read_rows(path)[:n]:
        params = dict(row.data[RESPONSES_CREATE_PARAMS], max_output_tokens=max_tokens)
        params["metadata"] = {"extra_body": json.dumps({"ignore_eos": True})}
        data = with_episode({**row.data, RESPONSES_CREATE_PARAMS: params}, f"{tag}-{row.row_id}")
        rows.append(TaskRow(row_id=row.row_id, data=data))
    return rows


def measure(
    stack: GymStack, root: str, rows: list[TaskRow], args: argparse.Namespace, abort: bool
) -> dict[str, Any]:
    start = tokens(root)
    client = AgentClient(
        stack.directory,
        timeouts=Timeouts(request=args.wait),
        retry=RetryPolicy(max_attempts=1),
        sampler_url=root if abort else None,
    )
    with client:
        played = client.run_sync(rows, eos_token_id=EOS)
    assert all(r.status is RolloutStatus.TIMEOUT for r in played), [r.error for r in played]
    gave_up = tokens(root)
    end, busy = idle(root, args.cap)
    for row in rows:  # the "before" episodes: stopped now, so the next run starts idle
        episode = json.loads(row.data[RESPONSES_CREATE_PARAMS]["metadata"]["extra_body"])
        requests.post(
            f"{root}/abort_episode",
            params={"episode_id": episode["nemogym_episode_id"]},
            timeout=10,
        )
    idle(root, 30.0, quiet=1.0)
    return {
        "mode": "after (abort)" if abort else "before (no abort)",
        "while_waiting": gave_up - start,
        "after_giving_up": end - gave_up,
        "busy_s": round(busy, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--episodes", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=600, help="tokens per turn")
    parser.add_argument("--wait", type=float, default=3.0, help="the client's deadline (s)")
    parser.add_argument("--cap", type=float, default=180.0, help="longest wait for idle (s)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-abandon-"))
    with start_serve(mode="sample", log_path=work / "serve.log") as sampler:
        root = sampler.base_url.removesuffix("/v1")
        policy = sampler.policy_model()
        with GymStack(
            ["target_chars"], policy, venv=find_gym_venv(), workdir=work / "gym"
        ) as stack:
            env = stack.config.environment("target_chars")
            path = Path(env.train_path or env.example_path)
            results = [
                measure(stack, root, long_rows(path, args.episodes, args.tokens, tag), args, abort)
                for tag, abort in (("before", False), ("after", True))
            ]
    print(
        f"{args.episodes} episodes x 3 turns x {args.tokens} tokens, abandoned at {args.wait:g} s"
    )
    print(f"{'mode':<20} {'while waiting':>14} {'after giving up':>16} {'busy after (s)':>15}")
    for r in results:
        print(
            f"{r['mode']:<20} {r['while_waiting']:>14} {r['after_giving_up']:>16} {r['busy_s']:>15}"
        )


if __name__ == "__main__":
    main()
