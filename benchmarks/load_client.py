"""Load test (not CI-gating): one AgentClient, many batches, faults on; do FDs and RSS plateau?

Starts ``local_servers.py`` in its own process with ``--fault-rate`` (a deterministic
share of /run requests gets a 503 or a reset connection), then plays ``--batches``
batches of ``--rollouts`` rollouts at ``--concurrency`` through one ``AgentClient`` via
``run_sync`` (the facade a synchronous trainer uses), parsing every result and dropping
it, as a trainer does. A sampler thread reads the process's open file descriptors
(``/proc/self/fd``) and RSS (``/proc/self/status``) every ``--interval`` seconds.

Prints one line per batch (rate, statuses, FD and RSS range while it ran) and a verdict:
FDs and RSS plateau when the later batches stay within the first batches' envelope (FDs)
or within ``--rss-slack`` of the second batch (RSS; the first batch pays for imports,
caches and the connection pool). After ``client.close()`` the FD count must return to
where it was before the client existed.

Usage: python benchmarks/load_client.py [--rollouts 5000] [--concurrency 256]
                                         [--batches 8] [--fault-rate 0.02]
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import attrs

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_client import make_rows
from local_servers import start_server

from nemogym_sdk import AgentClient, RetryPolicy, RolloutStatus, Timeouts

EOS = 2


def open_fds() -> int:
    """File descriptors this process has open."""
    return len(os.listdir("/proc/self/fd"))


def rss_mib() -> float:
    """Resident set size of this process in MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


@attrs.frozen
class Sample:
    at: float
    batch: int
    fds: int
    rss: float


class Sampler:
    """Samples FDs and RSS every ``interval`` seconds on a daemon thread."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self.batch = 0
        self.samples: list[Sample] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="load-sampler", daemon=True)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.samples.append(Sample(time.monotonic(), self.batch, open_fds(), rss_mib()))
            self._stop.wait(self.interval)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def of(self, batch: int) -> list[Sample]:
        return [s for s in self.samples if s.batch == batch]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=5000)
    parser.add_argument("--concurrency", type=int, default=256)
    parser.add_argument("--batches", type=int, default=8)
    parser.add_argument("--fault-rate", type=float, default=0.02)
    parser.add_argument("--interval", type=float, default=1.0)
    parser.add_argument("--rss-slack", type=float, default=0.10)
    args = parser.parse_args(argv)

    rows = make_rows(args.rollouts)
    retry = RetryPolicy(max_attempts=4, base_delay=0.01, max_delay=0.2)
    print(
        f"{args.batches} batches x {args.rollouts} rollouts at concurrency {args.concurrency}, "
        f"fault rate {args.fault_rate:.0%} (503s and resets), {os.cpu_count()} CPUs"
    )
    with start_server("--fault-rate", str(args.fault_rate)) as (url, _pid):
        fds_before = open_fds()
        client = AgentClient(
            {"bench": url},
            max_concurrency=args.concurrency,
            max_per_host=args.concurrency,
            retry=retry,
            timeouts=Timeouts(request=60.0),
        )
        ends: list[Sample] = []
        with Sampler(args.interval) as sampler:
            for batch in range(1, args.batches + 1):
                sampler.batch = batch
                started = time.perf_counter()
                rollouts = client.run_sync(rows, eos_token_id=EOS)
                seconds = time.perf_counter() - started
                statuses = Counter(r.status.value for r in rollouts)
                assert len(rollouts) == len(rows), "rollouts lost"
                del rollouts
                ends.append(Sample(time.monotonic(), batch, open_fds(), rss_mib()))
                during = sampler.of(batch) or [ends[-1]]
                print(
                    f"batch {batch}: {len(rows) / seconds:6.0f} rollouts/s  "
                    f"fds {min(s.fds for s in during)}-{max(s.fds for s in during)} "
                    f"(end {ends[-1].fds})  rss {min(s.rss for s in during):.0f}-"
                    f"{max(s.rss for s in during):.0f} MiB (end {ends[-1].rss:.0f})  "
                    f"{dict(statuses)}"
                )
                ok = statuses[RolloutStatus.OK.value]
                assert ok >= 0.99 * len(rows), f"only {ok} OK rollouts"
        client.close()
        fds_after = open_fds()

    samples = sampler.samples
    print(f"\n{len(samples)} samples; fds before the client {fds_before}, after close {fds_after}")
    first = [s for s in samples if s.batch <= 2]
    later = [s for s in samples if s.batch > 2]
    fd_ceiling = max(s.fds for s in first)
    fd_later = max((s.fds for s in later), default=fd_ceiling)
    rss_base = ends[1].rss if len(ends) > 1 else ends[0].rss
    rss_last = ends[-1].rss
    rss_peak_later = max((s.rss for s in later), default=rss_last)
    fds_flat = fd_later <= fd_ceiling + 8
    rss_flat = rss_last <= rss_base * (1 + args.rss_slack)
    fds_released = fds_after <= fds_before + 2
    print(
        f"FDs: max {fd_ceiling} in batches 1-2, max {fd_later} in batches 3-{args.batches} "
        f"-> {'plateau' if fds_flat else 'GROWING'}"
    )
    print(
        f"RSS: {rss_base:.0f} MiB after batch 2, {rss_last:.0f} MiB after batch "
        f"{args.batches} (peak {rss_peak_later:.0f} MiB in batches 3+) "
        f"-> {'plateau' if rss_flat else 'GROWING'}"
    )
    print(f"FDs after close: {'released' if fds_released else 'LEAKED'}")
    return 0 if fds_flat and rss_flat and fds_released else 1


if __name__ == "__main__":
    raise SystemExit(main())
