"""How ``make test`` spreads the suite over pytest-xdist workers (``--dist loadgroup``).

Every test gets an ``xdist_group``: tests of one group run on one worker, in collection
order, so a module's module-scoped fixtures (its NeMo Gym stacks, its cluster) start once.
The group is the test's module, except for what must not overlap with itself on a 2-core
machine, which shares one group and so one worker, one after another:

- ``heavy``: every test that starts real vLLM (two vLLM servers never run at once; the
  shared session server of ``tests/vllm`` starts after the modules that start their own),
  the loopback cluster (two learner ranks, two replicas, the router, two deployments) and
  the environment catalogue (``tests/gym/test_environments.py``: every shipped environment).

Groups are handed out longest first, by the seconds ``tests/durations.json`` records per
module (refreshed from a JUnit report by ``python -m tests.scheduling junit.xml``), so the
longest module does not start last. A module it does not list counts as 0 s.
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

import pytest

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


def module_of(item: pytest.Item) -> str:
    """``tests/...py``: the test's module, relative to the repository."""
    return item.nodeid.split("::", 1)[0]


def group_of(item: pytest.Item) -> str:
    """The xdist group of a test (see the module docstring)."""
    module = module_of(item)
    if module in HEAVY_MODULES or module.startswith("tests/vllm/"):
        return HEAVY
    if item.get_closest_marker("vllm") is not None:
        return HEAVY
    return module


def recorded_seconds() -> dict[str, float]:
    """Module -> seconds of its last full run (``tests/durations.json``)."""
    try:
        return {k: float(v) for k, v in json.loads(DURATIONS.read_text()).items()}
    except FileNotFoundError:
        return {}


def schedule(items: list[pytest.Item]) -> None:
    """Mark every item with its group and order the groups longest first (in place); the
    order within a group is the collection's."""
    seconds = recorded_seconds()
    groups: dict[str, list[pytest.Item]] = defaultdict(list)
    for item in items:
        group = group_of(item)
        item.add_marker(pytest.mark.xdist_group(group))
        groups[group].append(item)
    cost = {
        name: sum(seconds.get(m, 0.0) for m in {module_of(i) for i in members})
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
