"""Start-up failures and shutdown of real NeMo Gym stacks."""

from __future__ import annotations

import os

import pytest

from nemogym_sdk.errors import ConfigError, NotReadyError, UsageError
from nemogym_sdk.gym import ServerNotReadyError, ServerStartError
from nemogym_sdk.processes import group_alive
from nemogym_sdk.processes.forkserver import FORK_SERVERS_ENV_VAR

from .stacks import StackFactory

pytestmark = pytest.mark.gym

ENVIRONMENT = "example_single_tool_call"


def test_stop_leaves_no_process_of_any_group(stack_factory: StackFactory) -> None:
    """Leaving the context kills every process group; stop() again is a no-op."""
    stack = stack_factory([ENVIRONMENT])
    with stack:
        pids = dict(stack.pids)
        assert set(pids) == {spec.instance for spec in stack.config.servers}
        for pid in pids.values():
            assert os.getpgid(pid) == pid, "each server leads its own process group"
            assert group_alive(pid)
    assert not stack.is_running
    for name, pid in pids.items():
        assert not group_alive(pid), f"{name} (pid {pid}) survived stop()"
    stack.stop()
    log = stack.log_paths[f"{ENVIRONMENT}_simple_agent"].read_text()
    assert "Uvicorn running on http://127.0.0.1:" in log


def test_bad_server_config_fails_fast_with_name_and_log_tail(stack_factory: StackFactory) -> None:
    """A config the model server rejects: ServerStartError names it and quotes its log."""
    overrides = {
        "policy_model": {
            "responses_api_models": {"vllm_model": {"return_token_id_information": "maybe"}}
        }
    }
    stack = stack_factory([ENVIRONMENT], overrides=overrides)
    with pytest.raises(ServerStartError) as caught:
        stack.start()
    error = caught.value
    assert error.server == "policy_model"
    assert error.returncode not in (None, 0)
    assert "return_token_id_information" in error.log_tail
    assert "'policy_model'" in str(error) and error.log_tail.splitlines()[-1] in str(error)
    assert error.log_path == stack.log_paths["policy_model"]
    assert not stack.is_running
    for name, pid in stack.pids.items():
        assert not group_alive(pid), f"{name} (pid {pid}) left running after the failure"


def test_deadline_names_the_server_that_is_not_ready(
    stack_factory: StackFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A deadline shorter than start-up raises ServerNotReadyError and stops everything.
    Each server a new interpreter (seconds of imports): forked from a warm fork server, a
    stack can be ready within the 0.2 s."""
    monkeypatch.setenv(FORK_SERVERS_ENV_VAR, "0")
    stack = stack_factory([ENVIRONMENT], ready_timeout=0.2)
    with pytest.raises(ServerNotReadyError) as caught:
        stack.start()
    assert isinstance(caught.value, NotReadyError) and isinstance(caught.value, TimeoutError)
    assert caught.value.server in stack.pids
    assert caught.value.server in str(caught.value)
    for pid in stack.pids.values():
        assert not group_alive(pid)


def test_unknown_environment_fails_before_any_process(stack_factory: StackFactory) -> None:
    """An environment that NeMo Gym does not ship is a ConfigError; nothing is started."""
    stack = stack_factory(["no_such_environment"])
    with pytest.raises(ConfigError, match="no_such_environment"):
        stack.start()
    assert stack.pids == {}
    assert not stack.is_running


def test_start_twice_is_refused(stack_factory: StackFactory) -> None:
    """A stack starts once: a second start() raises instead of leaking processes."""
    stack = stack_factory(["no_such_environment"])
    with pytest.raises(ConfigError):
        stack.start()
    with pytest.raises(UsageError, match="already"):
        stack.start()
