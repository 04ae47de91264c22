"""A simulated large deployment: synchronous against asynchronous GRPO, 8 to 64 samplers.

Nothing is sampled and nothing sleeps: a discrete-event simulation in virtual time, so
thousands of episodes in flight cost no CPU. What it models:

- **Samplers.** Each replica shares its throughput among the requests it holds (processor
  sharing). Its aggregate throughput against batch size is vLLM's as measured on this box
  with a LoRA adapter (`reference/vllm_cpu.md` §9: 1 request ~220 tokens/s, 8 concurrent
  1,490, 32 concurrent 3,400), interpolated in log(batch) and flat beyond the last point,
  times ``--speedup`` (a GPU's factor; it scales time, not the comparison).
- **Episodes.** ``turns`` model calls of ``tokens`` tokens each; after each call the
  environment answers after a Pareto(alpha) delay (heavy-tailed tools), sometimes stalling
  until the episode deadline. A group's episodes go to one replica (prefix affinity),
  groups to the least loaded replica.
- **Learner.** A fixed time per step (``--learner-s``), then the new version is published.
- **Pacing.** The real engine's rules (`nemogym_sdk.rollout_engine.pacing.may_start`,
  `is_due` and `keeps_bound`): the same code decides which group may start, which a step
  must include, and when it waits for an older group.

    .venv/bin/python benchmarks/sim_async.py --replicas 8 16 32 64
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import math
import random
import statistics
from collections import Counter
from typing import Any

from nemogym_sdk.rollout_engine.pacing import is_due, keeps_bound, may_start

MEASURED = [(1, 220.0), (8, 1490.0), (32, 3400.0)]
"""(concurrent requests, aggregate tokens/s) of vLLM on CPU with a LoRA adapter."""


def throughput(batch: int) -> float:
    if batch <= MEASURED[0][0]:
        return MEASURED[0][1]
    for (b0, t0), (b1, t1) in itertools.pairwise(MEASURED):
        if batch <= b1:
            w = (math.log(batch) - math.log(b0)) / (math.log(b1) - math.log(b0))
            return t0 + w * (t1 - t0)
    return MEASURED[-1][1]


class Replica:
    """Processor sharing: every request gets throughput(b) / b tokens per second."""

    def __init__(self, index: int, speedup: float) -> None:
        self.index, self.speedup = index, speedup
        self.service = 0.0  # tokens served to each request so far, cumulative
        self.updated = 0.0
        self.active: list[tuple[float, int]] = []  # (service level at which it ends, id)
        self.epoch = 0
        self.busy_s = 0.0
        self.batch_time = 0.0  # integral of batch size over time

    def rate(self) -> float:
        b = len(self.active)
        return throughput(b) * self.speedup / b if b else 0.0

    def advance(self, now: float) -> None:
        dt = now - self.updated
        if self.active:
            self.service += self.rate() * dt
            self.busy_s += dt
            self.batch_time += len(self.active) * dt
        self.updated = now

    def next_finish(self) -> float | None:
        if not self.active:
            return None
        return self.updated + max(0.0, self.active[0][0] - self.service) / self.rate()


class Sim:
    def __init__(self, args: argparse.Namespace, replicas: int, mode: str) -> None:
        self.args, self.mode = args, mode
        self.rng = random.Random(args.seed)
        self.replicas = [Replica(i, args.speedup) for i in range(replicas)]
        self.groups_per_step = args.groups_per_replica * replicas
        self.k = 0 if mode == "sync" else args.max_staleness
        self.now = 0.0
        self.events: list[tuple[float, int, str, Any]] = []
        self.seq = 0
        self.episodes: dict[int, dict[str, Any]] = {}
        self.groups: dict[int, dict[str, Any]] = {}
        self.started = self.published = self.steps = 0
        self.finished: dict[int, dict[str, Any]] = {}
        self.learning = False
        self.ages: Counter[int] = Counter()
        self.step_ends: list[float] = []
        self.rollouts = 0
        self.open: dict[int, int] = {}
        self.playing_episodes = 0

    def push(self, at: float, kind: str, data: Any) -> None:
        self.seq += 1
        heapq.heappush(self.events, (at, self.seq, kind, data))

    # --- episodes -----------------------------------------------------------------------------

    def start_group(self) -> None:
        index = self.started
        self.started += 1
        replica = min(self.replicas, key=lambda r: len(r.active))
        self.groups[index] = {"left": self.args.num_generations, "started_on": self.published}
        self.open[index] = self.published  # started, not yet taken by the learner
        self.playing_episodes += self.args.num_generations
        for _ in range(self.args.num_generations):
            eid = len(self.episodes)
            deadline = self.now + self.args.episode_timeout
            self.episodes[eid] = {"group": index, "turn": 0, "replica": replica, "done": False}
            self.push(deadline, "deadline", eid)
            self.request(eid)

    def request(self, eid: int) -> None:
        replica: Replica = self.episodes[eid]["replica"]
        replica.advance(self.now)
        heapq.heappush(replica.active, (replica.service + self.args.tokens, eid))
        self.reschedule(replica)

    def reschedule(self, replica: Replica) -> None:
        replica.epoch += 1
        at = replica.next_finish()
        if at is not None:
            self.push(at, "generated", (replica, replica.epoch))

    def generated(self, replica: Replica, epoch: int) -> None:
        if epoch != replica.epoch:
            return  # superseded by a later change of this replica's load
        replica.advance(self.now)
        _, eid = heapq.heappop(replica.active)
        self.reschedule(replica)
        episode = self.episodes[eid]
        if episode["done"]:
            return
        episode["turn"] += 1
        a = self.args
        if self.rng.random() < a.stall_p:
            return  # the environment stalls: the deadline ends the episode
        delay = min(a.cap_s, a.scale_s * self.rng.paretovariate(a.alpha))
        self.push(self.now + delay, "env", eid)

    def env(self, eid: int) -> None:
        episode = self.episodes[eid]
        if episode["done"]:
            return
        if episode["turn"] >= self.args.turns:
            self.end(eid)
        else:
            self.request(eid)

    def end(self, eid: int) -> None:
        episode = self.episodes[eid]
        if episode["done"]:
            return
        episode["done"] = True
        self.playing_episodes -= 1
        group = self.groups[episode["group"]]
        group["left"] -= 1
        if group["left"] == 0:
            self.finished[episode["group"]] = group

    def deadline(self, eid: int) -> None:
        episode = self.episodes[eid]
        if not episode["done"]:
            replica: Replica = episode["replica"]
            replica.advance(self.now)
            replica.active = [(s, e) for s, e in replica.active if e != eid]
            heapq.heapify(replica.active)
            self.reschedule(replica)
            self.end(eid)

    # --- the learner ----------------------------------------------------------------------------

    def schedule(self) -> None:
        cap = self.args.max_inflight_per_replica * len(self.replicas)
        while (
            may_start(self.started, self.published, self.k, self.groups_per_step)
            and self.playing_episodes + self.args.num_generations <= cap
        ):
            self.start_group()
        if self.learning:
            return
        due = [i for i, v in self.open.items() if is_due(v, self.steps, self.k)]
        if all(i in self.finished for i in due) and len(self.finished) >= self.groups_per_step:
            order = sorted(
                self.finished, key=lambda i: (i not in due, self.finished[i]["started_on"], i)
            )[: self.groups_per_step]
            taken = [self.finished[i]["started_on"] for i in order]
            playing = len(self.open) > len(self.finished)
            if playing and not keeps_bound(
                taken, list(self.open.values()), self.steps, self.k, self.groups_per_step
            ):
                return  # the engine waits for an older group here
            for i in order:
                self.ages[self.steps - self.finished.pop(i)["started_on"]] += 1
                del self.open[i]
            self.rollouts += self.groups_per_step * self.args.num_generations
            self.learning = True
            self.push(self.now + self.args.learner_s, "learned", None)

    def run(self, steps: int) -> dict[str, Any]:
        handlers = {"generated": lambda d: self.generated(*d), "env": self.env,
                    "deadline": self.deadline, "learned": lambda d: self.learned()}  # fmt: skip
        self.schedule()
        while self.steps < steps:
            self.now, _, kind, data = heapq.heappop(self.events)
            handlers[kind](data)
            self.schedule()
        for replica in self.replicas:
            replica.advance(self.now)
        wall = self.now
        busy = statistics.mean(r.busy_s for r in self.replicas) / wall
        batch = sum(r.batch_time for r in self.replicas) / max(
            1e-9, sum(r.busy_s for r in self.replicas)
        )
        return {
            "wall_s": wall,
            "steps_per_hour": 3600 * steps / wall,
            "rollouts_per_s": self.rollouts / wall,
            "sampler_idle": 1 - busy,
            "batch_when_busy": batch,
            "ages": dict(sorted(self.ages.items())),
        }

    def learned(self) -> None:
        self.learning = False
        self.steps += 1
        self.published += 1
        self.step_ends.append(self.now)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--replicas", type=int, nargs="+", default=[8, 16, 32, 64])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--groups-per-replica", type=int, default=4)
    parser.add_argument("--num-generations", type=int, default=16)
    parser.add_argument("--max-staleness", type=int, default=1)
    parser.add_argument("--max-inflight-per-replica", type=int, default=256)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--scale-s", type=float, default=1.0)
    parser.add_argument("--alpha", type=float, default=1.5)
    parser.add_argument("--cap-s", type=float, default=60.0)
    parser.add_argument("--stall-p", type=float, default=0.001)
    parser.add_argument("--episode-timeout", type=float, default=180.0)
    parser.add_argument("--learner-s", type=float, default=30.0)
    parser.add_argument("--speedup", type=float, default=5.0, help="sampler speed vs the CPU")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(
        f"{args.turns} turns x {args.tokens} tokens, env delay {args.scale_s} s x "
        f"Pareto({args.alpha}) capped {args.cap_s} s, stall p {args.stall_p} per turn "
        f"(deadline {args.episode_timeout} s), learner {args.learner_s} s/step, "
        f"{args.groups_per_replica} groups x {args.num_generations} per replica per step, "
        f"K={args.max_staleness}"
    )
    print(f"{'replicas':>8} {'episodes/step':>13} {'mode':>5} {'steps/h':>8} {'rollouts/s':>10} "
          f"{'idle':>5} {'batch':>6}  staleness (groups per versions behind)")  # fmt: skip
    for replicas in args.replicas:
        results = {mode: Sim(args, replicas, mode).run(args.steps) for mode in ("sync", "async")}
        for mode, r in results.items():
            print(
                f"{replicas:8d} {replicas * args.groups_per_replica * args.num_generations:13d} "
                f"{mode:>5} {r['steps_per_hour']:8.1f} {r['rollouts_per_s']:10.1f} "
                f"{r['sampler_idle']:5.2f} {r['batch_when_busy']:6.1f}  {r['ages']}"
            )
        ratio = results["async"]["steps_per_hour"] / results["sync"]["steps_per_hour"]
        print(f"{'':8} {'':13} async/sync {ratio:.2f}x")


if __name__ == "__main__":
    main()
