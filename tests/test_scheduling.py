"""How the suite is spread over pytest-xdist workers (``tests/scheduling.py``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests import scheduling
from tests.scheduling import HEAVY, GroupScheduling, durations_from_junit, group_of, schedule

TESTS = Path(__file__).parent


class Item:
    """What ``schedule`` reads of a collected test."""

    def __init__(self, nodeid: str) -> None:
        self.nodeid = nodeid


def test_a_module_is_a_group_and_what_must_not_overlap_is_one() -> None:
    assert group_of("tests/test_hosts.py::test_a[x]") == "tests/test_hosts.py"
    assert group_of("tests/gym/test_train.py::test_b") == "tests/gym/test_train.py"
    for nodeid in (
        "tests/vllm/test_train_vllm.py::test_c",
        "tests/vllm/test_start_vllm.py::test_d",
        "tests/serve/test_vllm_real.py::test_e",
        "tests/cluster/test_loopback_cluster.py::test_f",
        "tests/gym/test_environments.py::test_g[wordle]",
    ):
        assert group_of(nodeid) == HEAVY, nodeid
    taught = "tests/serve/test_family_teach.py::test_a_taught_model_writes_its_familys_markup"
    assert group_of(f"{taught}[qwen3]") != group_of(f"{taught}[llama3]")  # SPLIT_MODULES


def test_every_vllm_test_is_in_the_heavy_group() -> None:
    """A module that marks a test ``vllm`` (it starts real vLLM) belongs to the heavy group,
    so that two vLLM servers never run at once."""
    marking = [
        path.relative_to(TESTS.parent).as_posix()
        for path in TESTS.rglob("test_*.py")
        if "pytest.mark.vllm" in path.read_text() and path != Path(__file__)
    ]
    assert marking, "no module marks a test vllm: the rule below checks nothing"
    assert [m for m in marking if group_of(f"{m}::t") != HEAVY] == []


def test_xdist_hands_out_the_groups_as_scopes() -> None:
    scheduler: Any = GroupScheduling.__new__(GroupScheduling)  # _split_scope reads no state
    assert scheduler._split_scope("tests/vllm/test_lora_sync.py::test_x") == HEAVY
    assert scheduler._split_scope("tests/test_ranks.py::test_y") == "tests/test_ranks.py"


def test_groups_go_longest_first_and_keep_their_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    recorded = {
        "tests/b.py": 10.0,
        "tests/vllm/x.py": 5.0,
        "tests/cluster/test_loopback_cluster.py": 7.0,
    }
    (tmp_path / "durations.json").write_text(json.dumps(recorded))
    monkeypatch.setattr(scheduling, "DURATIONS", tmp_path / "durations.json")
    ids = ["tests/a.py::1", "tests/vllm/x.py::2", "tests/b.py::3", "tests/vllm/x.py::4"]
    ids += ["tests/cluster/test_loopback_cluster.py::5", "tests/b.py::6"]
    items: list[Any] = [Item(nodeid) for nodeid in ids]
    schedule(items)
    assert [item.nodeid for item in items] == [
        *("tests/vllm/x.py::2", "tests/vllm/x.py::4", "tests/cluster/test_loopback_cluster.py::5"),
        *("tests/b.py::3", "tests/b.py::6", "tests/a.py::1"),  # heavy: 12 s; b: 10 s; a: 0 s
    ]


def test_durations_sum_each_modules_tests_from_junit(tmp_path: Path) -> None:
    report = tmp_path / "junit.xml"
    report.write_text(
        '<testsuites><testsuite time="9">'
        '<testcase classname="tests.gym.test_train" name="a" time="2.5"/>'
        '<testcase classname="tests.gym.test_train" name="b" time="1.0"/>'
        '<testcase classname="tests.test_hosts.TestHosts" name="c" time="0.5"/>'
        "</testsuite></testsuites>"
    )
    assert durations_from_junit(report) == {
        "tests/gym/test_train.py": 3.5,
        "tests/test_hosts.py": 0.5,
    }
