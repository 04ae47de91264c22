"""Shared test configuration: Hypothesis profiles, and the groups pytest-xdist runs.

``HYPOTHESIS_PROFILE=ci`` (the default) runs a few hundred examples per property;
``HYPOTHESIS_PROFILE=fuzz`` (``make fuzz``) runs at least 10,000.

The tests are ordered by group, longest group first, and pytest-xdist hands a group at a
time to a worker (``tests/scheduling.py``); without ``-n`` the order is the same.
"""

from __future__ import annotations

import os

# Two xdist workers share two cores, and each starts torch processes (samplers, learners):
# with OpenMP's default spin-wait every thread of one process burns a core while it waits for
# a thread the other process has descheduled; the torch example ran 10x slower beside one busy
# core (266 s against 28 s, benchmarks/README.md "Test suite"). Passive waiting sleeps instead.
# Set before anything imports torch (libgomp reads it once); subprocesses inherit it.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# (torch keeps its default of one thread per core: a run of the whole suite with one thread
# per process was slower, 1473 s against 1341 s, though the same CPU work takes less CPU on
# one thread; where a worker waits, the other's second thread uses the idle core. Teaching a
# family alone: 23 s wall and 38 s CPU on two threads, 33 s and 31 s on one.)
# vLLM on a CPU runs its model worker in a process of its own unless V1 multiprocessing is
# off; off, the worker runs inside the EngineCore process, one fewer process importing vLLM
# (the tiny model's server answers in ~15 s instead of ~22 s, alone on this machine). The
# server, its routes, LoRA and logprobs are the same; tests/vllm/test_start_vllm.py checks the
# process group either way.
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

import pytest
from hypothesis import HealthCheck, settings

from tests.scheduling import GroupScheduling, schedule

settings.register_profile(
    "ci",
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    print_blob=True,
)
settings.register_profile(
    "fuzz",
    max_examples=10_000,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    print_blob=True,
)
settings.register_profile("dev", max_examples=50, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The groups, longest first (before ``tests/vllm`` orders its own tests)."""
    schedule(items)


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> GroupScheduling:
    """pytest-xdist hands out whole groups (``tests/scheduling.py``)."""
    return GroupScheduling(config, log)
