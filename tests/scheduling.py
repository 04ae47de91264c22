"""How ``make test`` spreads the suite over pytest-xdist workers.

Tests of one group run on one worker, in collection order, so a module's module-scoped
fixtures (its NeMo Gym stacks, its cluster) start once. The group is the test's module,
except that a test of a ``SPLIT_MODULES`` module is a group of its own, and that what must
not overlap with itself on a 2-core machine shares one group and so one worker, one after
another:

- ``heavy``: every test that starts real vLLM (two vLLM servers never run at once; the
  shared session server of ``tests/vllm`` starts after the modules that start their own),
  the loopback cluster (two learner ranks, two replicas, the router, two deployments) and
  the environment catalogue (``tests/gym/test_environments.py``: every shipped environment).

Groups are handed out longest first, by the seconds ``tests/durations.json`` records per
module (refreshed from a JUnit report by ``python -m tests.scheduling junit.xml``), so the
longest module does not start last. A module it does not list counts as 0 s.

The groups are xdist's scopes (``GroupScheduling``, installed by ``tests/conftest.py``
through ``pytest_xdist_make_scheduler``), not ``xdist_group`` marks: xdist 3.8 marks a
group by appending it to the test's node id, which pytest 9.2's node ids no longer take.
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

import pytest
from xdist.scheduler import LoadScopeScheduling

TESTS = Path(__file__).resolve().parent
DURATIONS = TESTS / "durations.json"
HEAVY = "heavy"
HEAVY_MODULES = frozenset(
    {
        "tests/cluster/test_loopback_cluster.py",
        "tests/gym/test_environments.py",
        "tests/serve/test_vllm_real.py",
    }
)
"""Modules in the ``heavy`` group besides every test marked ``vllm`` and ``tests/vllm``."""
SPLIT_MODULES = frozenset({"tests/serve/test_family_teach.py"})
"""Modules whose tests are groups of their own: long, independent tests (no module fixture
to share) that would otherwise run one after another on one worker."""


def module_of(nodeid: str) -> str:
    """``tests/...py``: the module of a test's node id, relative to the repository."""
    return nodeid.split("::", 1)[0]


def group_of(nodeid: str) -> str:
    """The group of a test (see the module docstring). Every test marked ``vllm`` lives in
    ``tests/vllm``; ``test_every_vllm_test_is_in_the_heavy_group`` keeps it so."""
    module = module_of(nodeid)
    if module in HEAVY_MODULES or module.startswith("tests/vllm/"):
        return HEAVY
    if module in SPLIT_MODULES:
        return nodeid
    return module


class GroupScheduling(LoadScopeScheduling):
    """xdist's load-scope scheduling with ``group_of`` as the scope: a group at a time to a
    worker, in the order of the collection (run with ``--no-loadscope-reorder``)."""

    def _split_scope(self, nodeid: str) -> str:
        return group_of(nodeid)


def recorded_seconds() -> dict[str, float]:
    """Module -> seconds of its last full run (``tests/durations.json``)."""
    try:
        return {k: float(v) for k, v in json.loads(DURATIONS.read_text()).items()}
    except FileNotFoundError:
        return {}


def schedule(items: list[pytest.Item]) -> None:
    """Order the groups longest first (in place); the order within a group is the
    collection's."""
    seconds = recorded_seconds()
    groups: dict[str, list[pytest.Item]] = defaultdict(list)
    for item in items:
        groups[group_of(item.nodeid)].append(item)
    cost = {
        name: sum(seconds.get(m, 0.0) for m in {module_of(i.nodeid) for i in members})
        for name, members in groups.items()
    }
    ordered = sorted(groups, key=lambda name: -cost[name])  # stable: ties keep their order
    items[:] = [item for name in ordered for item in groups[name]]


def durations_from_junit(report: Path) -> dict[str, float]:
    """Module -> seconds (setup, call and teardown) summed from a pytest JUnit report."""
    totals: dict[str, float] = defaultdict(float)
    for case in ET.parse(report).getroot().iter("testcase"):
        module = case.get("classname", "").split(".")
        # classname is the dotted module path (plus a class); keep the tests/...py part
        parts = [p for p in module if not p[:1].isupper()]
        totals["/".join(parts) + ".py"] += float(case.get("time", "0"))
    return {k: round(v, 1) for k, v in sorted(totals.items(), key=lambda kv: -kv[1])}


if __name__ == "__main__":
    table = durations_from_junit(Path(sys.argv[1]))
    DURATIONS.write_text(json.dumps(table, indent=1) + "\n")
    print(f"{DURATIONS}: {len(table)} modules, {sum(table.values()):.0f} s")
