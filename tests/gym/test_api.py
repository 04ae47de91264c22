"""nemogym_sdk.gym's layering and the shape of a stack (the exported names are locked
once, for every package, in tests/test_public_api.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import nemogym_sdk.gym
from nemogym_sdk.errors import UsageError
from nemogym_sdk.gym import GymStack, PolicyModel, ServerNotReadyError, free_loopback_ports

from .fakes import make_venv


def test_a_stack_says_where_its_servers_are_in_one_place(tmp_path: Path) -> None:
    """Addresses come from ``GymStack.directory`` only (a ``ServerDirectory``); the
    parallel URL accessors are gone, the environment -> agent pairing is on the setups."""
    stack = GymStack(
        ["toy"], PolicyModel(base_url="http://x/v1", model="m"), venv=make_venv(tmp_path)
    )
    public = {name for name in dir(stack) if not name.startswith("_")}
    removed = {"agent_urls", "resources_urls", "model_urls", "default_agents", "agent_url"}
    assert not public & (removed | {"head_url"})
    assert {"directory", "builder", "environment", "environments", "log_paths", "pids"} <= public


def test_all_is_sorted() -> None:
    """nemogym_sdk.gym.__all__ is in plain sorted order, each name once (which names it
    holds is locked in tests/test_public_api.py)."""
    names = nemogym_sdk.gym.__all__
    assert names == sorted(set(names))


def test_layering_no_nemo_gym_and_not_imported_by_the_core() -> None:
    """`import nemogym_sdk` leaves gym out; `import nemogym_sdk.gym` never imports nemo_gym."""
    code = (
        "import sys, nemogym_sdk\n"
        "assert not any(m.startswith('nemogym_sdk.gym') for m in sys.modules), 'core imports gym'\n"
        "import nemogym_sdk.gym\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in "
        "('nemo_gym', 'resources_servers', 'responses_api_agents', 'ray', 'torch')]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_dead_backend_fails_before_any_server_starts(tmp_path: Path) -> None:
    """backend_timeout: an unreachable backend raises ServerNotReadyError, nothing started."""
    venv = make_venv(tmp_path / "venv")
    (port,) = free_loopback_ports(1)
    model = PolicyModel(base_url=f"http://127.0.0.1:{port}/v1", model="m")
    stack = GymStack(["toy"], model, venv=venv, workdir=tmp_path / "w", backend_timeout=0.3)
    with pytest.raises(ServerNotReadyError, match="backend of policy_model") as caught:
        stack.start()
    assert f"127.0.0.1:{port}/v1/models" in caught.value.log_tail
    assert stack.pids == {}
    assert not stack.is_running


def test_properties_need_a_started_stack(tmp_path: Path) -> None:
    """Before start() the config-derived properties raise instead of returning nothing."""
    venv = make_venv(tmp_path / "venv")
    stack = GymStack(["toy"], PolicyModel(base_url="http://127.0.0.1:1/v1", model="m"), venv=venv)
    with pytest.raises(UsageError, match="not been started"):
        _ = stack.config
    with pytest.raises(UsageError, match="not running"):
        _ = stack.directory
    assert stack.builder.environments == ("toy",)
    assert "not started" in repr(stack)
    with pytest.raises(ValueError, match="sequence of names"):
        GymStack("toy", PolicyModel(base_url="http://x/v1", model="m"), venv=venv)


def test_a_resolver_worker_that_exited_is_closed_when_it_is_replaced(tmp_path: Path) -> None:
    """The NeMo Gym config resolver's worker ends by itself when idle; the next use starts
    another and closes the old one's pipes and log (left to the garbage collector, they
    raised a ResourceWarning in whatever test ran then)."""
    from nemogym_sdk.gym import resolve

    venv = make_venv(tmp_path / "venv")
    first = resolve._worker(venv)
    first._process.kill()
    first._process.wait()
    second = resolve._worker(venv)
    assert second is not first and second._process.poll() is None
    assert first._process.stdout is not None and first._process.stdout.closed
    assert first._log.closed
