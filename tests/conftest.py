"""Shared test configuration: Hypothesis profiles, and the groups pytest-xdist runs.

``HYPOTHESIS_PROFILE=ci`` (the default) runs a few hundred examples per property;
``HYPOTHESIS_PROFILE=fuzz`` (``make fuzz``) runs at least 10,000.

Every test is put in an xdist group and the groups are ordered longest first
(``tests/scheduling.py``); without ``-n`` the order is the same and the groups do nothing.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings

from tests.scheduling import schedule

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
    """Groups for pytest-xdist, longest first (before xdist reads the groups)."""
    schedule(items)
