"""GymStack's launching mechanics, exercised with toy servers (no real NeMo Gym needed)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import requests
import yaml

from nemogym_sdk.errors import ConfigError
from nemogym_sdk.gym import GymStack, PolicyModel
from nemogym_sdk.gym.builder import child_env
from nemogym_sdk.gym.server_envs import find_uv
from nemogym_sdk.processes import group_alive
from nemogym_sdk.processes.forkserver import FORK_SERVERS_ENV_VAR

from .fakes import make_venv

MODEL = PolicyModel(base_url="http://127.0.0.1:1/v1", model="m")


def _probe(url: str) -> dict[str, object]:
    probe = requests.get(f"{url}/probe", timeout=10).json()
    assert isinstance(probe, dict)
    return probe


@pytest.mark.parametrize("forked", [True, False], ids=["forked", "new-interpreter"])
def test_each_server_gets_the_config_its_name_and_its_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, forked: bool
) -> None:
    """Every process sees the whole config, its own instance name, cwd and PYTHONPATH; the
    stack's directory lists each at the address it answers on: forked from the venv's fork
    server (the default) as when each is a new interpreter (``NEMOGYM_FORK_SERVERS=0``)."""
    monkeypatch.setenv(FORK_SERVERS_ENV_VAR, "1" if forked else "0")
    venv = make_venv(tmp_path / "venv")
    with GymStack(["toy"], MODEL, venv=venv, workdir=tmp_path / "w", ready_timeout=30) as stack:
        written = yaml.safe_load(stack.config_path.read_text())
        urls = {s.name: s.url for s in stack.directory.servers()}
        assert set(urls) == {"toy", "toy_simple_agent", "policy_model"}
        assert stack.directory.default_agent == "toy_simple_agent"
        assert stack.environment("toy").agent == "toy_simple_agent"
        for spec in stack.config.servers:
            probe = _probe(urls[spec.instance])
            server_dir = str(venv.server_dir(spec.server_type, spec.impl))
            assert probe["instance"] == spec.instance
            assert probe["cwd"] == probe["pythonpath"] == server_dir
            assert probe["config"] == written == stack.config.global_config
        pids = stack.pids
    assert not any(group_alive(pid) for pid in pids.values())
    log = stack.log_paths["toy"].read_text()
    assert "toy server toy on" in log
    assert ("(forked, nemo_gym.server_utils" in log.splitlines()[0]) is forked


def test_server_files_overlay_feeds_the_server_and_spares_the_venv(tmp_path: Path) -> None:
    """server_files: the server runs from an overlay holding the file; the venv is untouched."""
    venv = make_venv(tmp_path / "venv")
    words = tmp_path / "words.txt"
    words.write_text("crane\nslate\n")
    with GymStack(
        ["toy"],
        MODEL,
        venv=venv,
        workdir=tmp_path / "w",
        server_files={"resources_servers/toy": {"data/guesses.txt": words}},
    ) as stack:
        probe = _probe(stack.directory.resources_url("toy"))
        overlay = stack.workdir / "servers" / "resources_servers" / "toy"
        assert probe["data"] == "crane\nslate\n"
        assert probe["cwd"] == str(overlay)
        assert probe["file"] == str(overlay / "app.py")
        agent = _probe(stack.directory.agent_url("toy_simple_agent"))
        assert agent["cwd"] == str(venv.server_dir("responses_api_agents", "simple_agent"))
    assert not (venv.resources_server_dir("toy") / "data" / "guesses.txt").exists()


def test_server_files_for_an_absent_server_is_refused(tmp_path: Path) -> None:
    """Files for a server directory the stack does not run are a ConfigError, nothing runs."""
    venv = make_venv(tmp_path / "venv")
    stack = GymStack(
        ["toy"],
        MODEL,
        venv=venv,
        workdir=tmp_path / "w",
        server_files={"resources_servers/wordle": {"data/guesses.txt": "x\n"}},
    )
    with pytest.raises(ConfigError, match="resources_servers/wordle"):
        stack.start()
    assert stack.pids == {}


def test_child_environment_is_scrubbed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The SDK's PYTHONPATH/VIRTUAL_ENV and stale NEMO_GYM_* do not leak into servers."""
    venv = make_venv(tmp_path / "venv")
    monkeypatch.setenv("PYTHONPATH", "/leaked")
    monkeypatch.setenv("NEMO_GYM_CONFIG_PATH", "stale")
    monkeypatch.setenv("NEMO_GYM_SOMETHING", "stale")
    stack = GymStack(["toy"], MODEL, venv=venv, workdir=tmp_path / "w", extra_env={"X_EXTRA": "1"})
    with stack:
        env = child_env(venv, "cfg", {"X_EXTRA": "1"})
        probe = _probe(stack.directory.resources_url("toy"))
    assert probe["instance"] == "toy"
    assert "/leaked" not in str(probe["pythonpath"])
    assert "PYTHONPATH" not in env and "NEMO_GYM_SOMETHING" not in env
    assert env["NEMO_GYM_CONFIG_DICT"] == "cfg"
    assert env["VIRTUAL_ENV"] == str(venv.root)
    assert env["X_EXTRA"] == "1"
    assert env["PATH"].split(os.pathsep)[0] == str(venv.python.parent)
    assert json.loads(json.dumps(env))  # plain strings only


def test_servers_find_the_sdks_uv_on_their_path(tmp_path: Path) -> None:
    """NeMo Gym's launcher runs servers with uv on PATH and some use it at start-up; the
    stack puts the uv it builds per-server venvs with first on its servers' PATH."""
    venv = make_venv(tmp_path / "v")
    path = child_env(venv, "config: {}", {})["PATH"].split(os.pathsep)
    assert path[0] == str(venv.python.parent)
    assert path[1] == str(Path(find_uv()[0]).parent)
