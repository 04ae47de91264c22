"""Compatibility with real NeMo Gym 0.7.0: vllm_model + simple_agent + example_single_tool_call.

The three kinds of Gym servers run in "manual mode" (``reference/nemo_gym_protocol.md`` §9.3):
each is ``.venv-gym/bin/python app.py`` in its own directory, with the resolved config in
``NEMO_GYM_CONFIG_DICT`` and its instance name in ``NEMO_GYM_CONFIG_PATH``, on pinned loopback
ports; no Ray, no head server. Two model servers cover both token sources of ``vllm_model``:
``return_token_ids`` inline ids, and ``/tokenize`` for the prompt (the training config default).
Our server runs in this process, in scripted mode with one tool turn.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

pytest.importorskip("transformers")

from nemogym_sdk.processes import free_loopback_ports
from nemogym_sdk.serve import CausalLMBackend, ServeEngine, ServerThread

REPO = Path(__file__).resolve().parents[2]
GYM_PYTHON = REPO / ".venv-gym" / "bin" / "python"
GYM_SITE = REPO / ".venv-gym" / "lib" / "python3.13" / "site-packages"
MODEL_NAME = "nemogym-tiny"
START_TIMEOUT_S = 180.0

pytestmark = [
    pytest.mark.gym,
    pytest.mark.slow,
    pytest.mark.skipif(
        not GYM_PYTHON.exists(),
        reason="needs the NeMo Gym venv at .venv-gym/bin/python (nemo-gym 0.7.0, Python 3.13)",
    ),
]


def _gym_config(base_url: str, ports: dict[str, int]) -> dict[str, Any]:
    """The resolved Gym config: one resources server, two model servers, two agents."""

    def model(port: int, inline_ids: bool) -> dict[str, Any]:
        return {
            "responses_api_models": {
                "vllm_model": {
                    "entrypoint": "app.py",
                    "host": "127.0.0.1",
                    "port": port,
                    "base_url": base_url,
                    "api_key": "dummy",
                    "model": MODEL_NAME,
                    "return_token_id_information": True,
                    "request_prompt_and_generation_token_ids": inline_ids,
                    "uses_reasoning_parser": False,
                }
            }
        }

    def agent(port: int, model_name: str) -> dict[str, Any]:
        return {
            "responses_api_agents": {
                "simple_agent": {
                    "entrypoint": "app.py",
                    "host": "127.0.0.1",
                    "port": port,
                    "max_steps": 5,
                    "resources_server": {"type": "resources_servers", "name": "weather"},
                    "model_server": {"type": "responses_api_models", "name": model_name},
                }
            }
        }

    return {
        "head_server": {"host": "127.0.0.1", "port": free_loopback_ports(1)[0]},
        "dry_run": False,
        "weather": {
            "resources_servers": {
                "example_single_tool_call": {
                    "entrypoint": "app.py",
                    "domain": "agent",
                    "host": "127.0.0.1",
                    "port": ports["weather"],
                }
            }
        },
        "policy_model": model(ports["policy_model"], inline_ids=True),
        "policy_model_tokenize": model(ports["policy_model_tokenize"], inline_ids=False),
        "agent": agent(ports["agent"], "policy_model"),
        "agent_tokenize": agent(ports["agent_tokenize"], "policy_model_tokenize"),
    }


_SERVER_DIRS = {
    "weather": "resources_servers/example_single_tool_call",
    "policy_model": "responses_api_models/vllm_model",
    "policy_model_tokenize": "responses_api_models/vllm_model",
    "agent": "responses_api_agents/simple_agent",
    "agent_tokenize": "responses_api_agents/simple_agent",
}


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """End a server and its children: SIGTERM to its own process group, then SIGKILL."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    except ProcessLookupError:
        pass


def _wait_ready(
    urls: dict[str, str], procs: dict[str, subprocess.Popen[bytes]], logs: Path
) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    pending = dict(urls)
    while pending:
        for name, url in list(pending.items()):
            if procs[name].poll() is not None:
                log = (logs / f"{name}.log").read_text(errors="replace")[-3000:]
                raise RuntimeError(f"Gym server {name} exited early:\n{log}")
            try:
                if requests.get(url, timeout=2).status_code == 200:
                    del pending[name]
            except requests.RequestException:
                pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"Gym servers not ready after {START_TIMEOUT_S}s: {sorted(pending)}")
        time.sleep(0.3)


@pytest.fixture(scope="module")
def gym_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """Our server in-process plus five real Gym servers; yields the agents' URLs."""
    logs = tmp_path_factory.mktemp("gym_logs")
    engine = ServeEngine(
        CausalLMBackend.tiny(seed=0), served_model_name=MODEL_NAME, scripted_tool_turns=1
    )
    procs: dict[str, subprocess.Popen[bytes]] = {}
    with ServerThread(engine) as ours:
        ports = dict(zip(_SERVER_DIRS, free_loopback_ports(len(_SERVER_DIRS)), strict=True))
        config_text = json.dumps(_gym_config(ours.base_url, ports))  # JSON is YAML
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        try:
            for name, subdir in _SERVER_DIRS.items():
                with open(logs / f"{name}.log", "wb") as log:
                    procs[name] = subprocess.Popen(
                        [str(GYM_PYTHON), "app.py"],
                        cwd=GYM_SITE / subdir,
                        env={
                            **env,
                            "NEMO_GYM_CONFIG_DICT": config_text,
                            "NEMO_GYM_CONFIG_PATH": name,
                        },
                        stdin=subprocess.DEVNULL,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
            _wait_ready({n: f"http://127.0.0.1:{p}/" for n, p in ports.items()}, procs, logs)
            yield {
                "inline": f"http://127.0.0.1:{ports['agent']}",
                "tokenize": f"http://127.0.0.1:{ports['agent_tokenize']}",
            }
        finally:
            for proc in procs.values():
                _stop(proc)


def _example_row() -> dict[str, Any]:
    path = GYM_SITE / "resources_servers/example_single_tool_call/data/example.jsonl"
    with open(path) as stream:
        return dict(json.loads(stream.readline()))


@pytest.mark.parametrize("token_source", ["inline", "tokenize"])
def test_real_gym_rollout_is_rewarded_and_token_exact(
    gym_stack: dict[str, str], token_source: str
) -> None:
    """/run through real vllm_model + simple_agent: reward 1.0, turn 2 extends turn 1's tokens."""
    response = requests.post(f"{gym_stack[token_source]}/run", json=_example_row(), timeout=120)
    assert response.status_code == 200, response.text[-2000:]
    result = response.json()

    assert result["reward"] == 1.0
    output = result["response"]["output"]
    assert [item["type"] for item in output] == ["function_call", "function_call_output", "message"]
    assert output[0]["name"] == "get_weather"
    assert json.loads(output[0]["arguments"]) == {"city": "example city"}
    assert "example city" in output[1]["output"]

    turns = [item for item in output if item.get("generation_token_ids")]
    assert len(turns) == 2
    for turn in turns:
        assert len(turn["generation_log_probs"]) == len(turn["generation_token_ids"])
        assert all(lp <= 0.0 for lp in turn["generation_log_probs"])
    first, second = turns
    seen = first["prompt_token_ids"] + first["generation_token_ids"]
    assert second["prompt_token_ids"][: len(seen)] == seen
    assert len(second["prompt_token_ids"]) > len(seen)
