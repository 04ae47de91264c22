"""start_serve: nemogym_sdk.serve as a process on a free loopback port, stopped by its group."""

from __future__ import annotations

from pathlib import Path

import pytest
import requests

from nemogym_sdk.gym import PolicyModel, ServerStartError, start_serve
from nemogym_sdk.processes import group_alive
from nemogym_sdk.processes.forkserver import FORK_SERVERS_ENV_VAR, ForkedChild

pytest.importorskip("transformers")


@pytest.mark.parametrize(
    ("fork", "fork_servers", "forked"),
    [(False, "1", False), (True, "1", True), (True, "0", False)],
    ids=["new-interpreter", "forked", "fork-servers-off"],
)
def test_start_serve_answers_then_stops_with_its_group(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fork: bool, fork_servers: str, forked: bool
) -> None:
    """The server answers on base_url with the tiny model's name; the PolicyModel it builds
    requests the adapter name given; stop() leaves no process of its group behind. A new
    interpreter by default; with ``fork=True`` forked from a fork server that imported
    torch, transformers and peft, unless ``NEMOGYM_FORK_SERVERS=0``."""
    monkeypatch.setenv(FORK_SERVERS_ENV_VAR, fork_servers)
    log = tmp_path / "serve.log"
    with start_serve(mode="scripted", log_path=log, fork=fork) as backend:
        assert isinstance(backend.process.popen, ForkedChild) is forked
        models = requests.get(f"{backend.base_url}/models", timeout=10).json()
        assert [card["id"] for card in models["data"]] == [backend.served_model_name]
        assert backend.base_url.startswith("http://127.0.0.1:") and backend.log_path == log
        model = backend.policy_model("policy")
        assert isinstance(model, PolicyModel)
        assert (model.base_url, model.model) == (backend.base_url, "policy")
        assert backend.policy_model().model == backend.served_model_name
        pid = backend.pid
    assert not group_alive(pid)
    assert "ready: model=nemogym-tiny mode=scripted" in log.read_text()
    header = log.read_text().splitlines()[0]
    assert ("(forked, torch, transformers, peft, nemogym_sdk.serve.app imported)" in header) is (
        forked
    )


def test_a_server_that_cannot_start_raises_with_its_log(tmp_path: Path) -> None:
    """A bad --model makes the process exit: ServerStartError quotes the log's tail."""
    with pytest.raises(ServerStartError, match="Model directory not found"):
        start_serve(model=tmp_path / "missing", log_path=tmp_path / "serve.log")
