"""start_serve: nemogym_sdk.serve as a process on a free loopback port, stopped by its group."""

from __future__ import annotations

from pathlib import Path

import pytest
import requests

from nemogym_sdk.gym import PolicyModel, ServerStartError, start_serve
from nemogym_sdk.processes import group_alive

pytest.importorskip("transformers")


def test_start_serve_answers_then_stops_with_its_group(tmp_path: Path) -> None:
    """The server answers on base_url with the tiny model's name; the PolicyModel it builds
    requests the adapter name given; stop() leaves no process of its group behind."""
    log = tmp_path / "serve.log"
    with start_serve(mode="scripted", log_path=log) as backend:
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


def test_a_server_that_cannot_start_raises_with_its_log(tmp_path: Path) -> None:
    """A bad --model makes the process exit: ServerStartError quotes the log's tail."""
    with pytest.raises(ServerStartError, match="Model directory not found"):
        start_serve(model=tmp_path / "missing", log_path=tmp_path / "serve.log")
