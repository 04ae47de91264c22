"""pytest fixture for the fake NeMo Gym agent.

Enable it in a ``conftest.py`` (it is not loaded automatically)::

    pytest_plugins = ["nemogym_sdk.testing.pytest_plugin"]

Then ``nemo_gym_agent(responses, plan=...)`` starts a ``fake_agent`` on 127.0.0.1 and
returns the running ``FakeAgent``; every agent a test started is stopped after it::

    def test_retries(nemo_gym_agent):
        agent = nemo_gym_agent([SINGLE_TURN], plan={"t0": burst(Fault.HTTP_503, 1)})
        ...
        assert agent.attempts("t0") == 2
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack
from typing import Any

import pytest

from nemogym_sdk.testing.fake_agent import FakeAgent, fake_agent

__all__ = ["nemo_gym_agent"]


@pytest.fixture
def nemo_gym_agent() -> Iterator[Callable[..., FakeAgent]]:
    """Start fake NeMo Gym agents (``fake_agent``'s arguments); stopped after the test."""
    with ExitStack() as stack:

        def start(*args: Any, **kwargs: Any) -> FakeAgent:
            return stack.enter_context(fake_agent(*args, **kwargs))

        yield start
