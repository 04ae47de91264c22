"""The test suite's timing table for benchmarks/README.md, from pytest's JUnit report.

    .venv/bin/python -m pytest ... --junitxml=junit.xml      # make test PYTEST_ARGS=...
    .venv/bin/python benchmarks/suite_durations.py junit.xml [--top 30]

Prints markdown: the wall time of the run, the summed test time (setup, call and teardown,
over every worker), the counts, and the ``--top`` slowest tests.
"""

from __future__ import annotations

import argparse
import xml.etree.ElementTree as ET
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("junit", type=Path)
    parser.add_argument("--top", type=int, default=30)
    args = parser.parse_args()
    root = ET.parse(args.junit).getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    assert suite is not None, f"{args.junit}: no <testsuite>"
    cases = []
    for case in suite.iter("testcase"):
        outcome = "passed"
        for tag in ("failure", "error", "skipped"):
            if case.find(tag) is not None:
                outcome = tag
        parts = case.get("classname", "").split(".")
        module = [p for p in parts if not p[:1].isupper()]  # a test class is not a path
        name = "/".join(module) + ".py::" + "::".join([*parts[len(module) :], case.get("name", "")])
        cases.append((float(case.get("time", "0")), name, outcome))
    counts = {o: sum(1 for *_, got in cases if got == o) for o in ("passed", "skipped")}
    failed = sum(1 for *_, got in cases if got in ("failure", "error"))
    print(f"- wall time of pytest: {float(suite.get('time', '0')):.0f} s")
    print(f"- summed test time: {sum(t for t, *_ in cases):.0f} s over {len(cases)} tests")
    print(f"- passed {counts['passed']}, skipped {counts['skipped']}, failed {failed}")
    print()
    print("| # | seconds | test |\n|---:|---:|---|")
    for rank, (seconds, name, _) in enumerate(sorted(cases, reverse=True)[: args.top], 1):
        print(f"| {rank} | {seconds:.1f} | `{name}` |")


if __name__ == "__main__":
    main()
