"""A factory for test stacks with the suite's defaults (imported by conftest and tests)."""

from __future__ import annotations

from typing import Any

import pytest

from nemogym_sdk.gym import GymStack, GymVenv, PolicyModel

READY_TIMEOUT_S = 300.0
"""Generous: 17 NeMo Gym processes importing at once take ~70 s on 2 cores."""


def agent_url(stack: GymStack, environment: str) -> str:
    """Base URL of the agent an environment's rows go to (``POST {url}/run``)."""
    agent = stack.environment(environment).agent
    assert agent is not None, f"{environment} starts no agent"
    return stack.directory.agent_url(agent)


def head_url(stack: GymStack) -> str:
    """The head server's URL of a stack started with ``head_server=True``."""
    url = stack.directory.head_url
    assert url is not None, "the stack runs without a head server"
    return url


class StackFactory:
    """Builds stacks with the test defaults; stops every stack it built at teardown."""

    def __init__(self, venv: GymVenv, model: PolicyModel, tmp: pytest.TempPathFactory) -> None:
        self.venv = venv
        self.model = model
        self._tmp = tmp
        self._stacks: list[GymStack] = []

    def __call__(self, environments: list[str], **kwargs: Any) -> GymStack:
        """A not-yet-started stack; keyword arguments override the defaults."""
        options: dict[str, Any] = {
            "venv": self.venv,
            "workdir": self._tmp.mktemp("stack"),
            "ready_timeout": READY_TIMEOUT_S,
            "default_max_steps": 8,
        }
        options.update(kwargs)
        model = options.pop("model", self.model)
        stack = GymStack(environments, model, **options)
        self._stacks.append(stack)
        return stack

    def stop_all(self) -> None:
        """Stop every stack built (idempotent)."""
        for stack in self._stacks:
            stack.stop()
