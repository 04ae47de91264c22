"""Real vLLM behind real NeMo Gym: our proxy keeps multi-turn token histories exact; plain vLLM
does not.

One vLLM server (``start_vllm``, the tiny byte-level model, ``--logprobs-mode
processed_logprobs``) serves two NeMo Gym stacks of the toy multi-turn environment
``target_chars`` (3 rounds, a user message between model turns), one after the other, on the
same rows with the same seeds:

* through our proxy (``python -m nemogym_sdk.serve --backend vllm``): every rollout parses
  under ``DriftPolicy.RAISE``, so 100 % of model turns extend the previous turn's tokens;
* with NeMo Gym's ``vllm_model`` pointed straight at vLLM: vLLM re-renders the history from
  the decoded text, and a random byte-level model's output does not survive decode +
  re-encode (bytes that are not valid UTF-8 come back as U+FFFD, special tokens are
  dropped), so rollouts drift. The test counts them and requires at least one.

Skips only when ``.venv-vllm`` or ``.venv-gym`` is absent.
"""

from __future__ import annotations

import concurrent.futures
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.require import absent

pytest.importorskip("transformers")

from nemogym_sdk import DriftPolicy, parse_agent_response
from nemogym_sdk.errors import DriftError
from nemogym_sdk.gym import (
    BackendProcess,
    GymStack,
    GymVenvNotFoundError,
    PolicyModel,
    VllmVenvNotFoundError,
    find_gym_venv,
    find_vllm_venv,
    start_serve,
    start_vllm,
)
from nemogym_sdk.serve.record import read_records, turn_key
from nemogym_sdk.serve.tiny import save_tiny

pytestmark = [pytest.mark.gym, pytest.mark.slow]

EOS = 258
ROLLOUTS_PER_ROW = 4
LOGPROBS_MODE = "processed_logprobs"


@pytest.fixture(scope="module")
def vllm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[BackendProcess, Path]]:
    """A real vLLM server on the tiny model (processed logprobs) and the model directory."""
    try:
        venv = find_vllm_venv()
        find_gym_venv()
    except (VllmVenvNotFoundError, GymVenvNotFoundError) as exc:
        absent(f"real vLLM + NeMo Gym test skipped: {exc}")
    model_dir = save_tiny(tmp_path_factory.mktemp("proxy-model") / "tiny", 0)
    log = tmp_path_factory.mktemp("proxy-vllm-log") / "vllm.log"
    with start_vllm(
        model_dir,  # no served name: vLLM serves it under its path, as start_vllm says
        venv=venv,
        extra_args=("--logprobs-mode", LOGPROBS_MODE),
        log_path=log,
        fork=True,
    ) as server:
        yield server, model_dir


def _run_all(agent_url: str, rows: list[dict[str, Any]]) -> list[bytes]:
    """POST every row to ``/run`` (4 at a time, a fresh cookie jar each); raw result bytes."""

    def run(row: dict[str, Any]) -> bytes:
        response = requests.post(f"{agent_url}/run", json=row, timeout=300)
        assert response.status_code == 200, response.text[-2000:]
        return response.content

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        return list(pool.map(run, rows))


def _drift_turn(raw: bytes) -> int | None:
    """The model turn at which the rollout drifts (``None`` = contiguous)."""
    try:
        parse_agent_response(raw, EOS, on_drift=DriftPolicy.RAISE)
    except DriftError:
        output = json.loads(raw)["response"]["output"]
        turns = [item for item in output if item.get("generation_token_ids")]
        seen = turns[0]["prompt_token_ids"] + turns[0]["generation_token_ids"]
        for index, turn in enumerate(turns[1:], start=1):
            if turn["prompt_token_ids"][: len(seen)] != seen:
                return index
            seen = turn["prompt_token_ids"] + turn["generation_token_ids"]
        raise
    return None


def test_proxy_keeps_every_rollout_contiguous_where_plain_vllm_drifts(
    vllm: tuple[BackendProcess, Path], tmp_path: Path
) -> None:
    """The same 5 rows x 4 rollouts of target_chars: proxy 0 drifted, plain vLLM > 0."""
    server, model_dir = vllm
    served = server.served_model_name
    cards = requests.get(f"{server.base_url}/models", timeout=10).json()["data"]
    assert served == str(model_dir.resolve()) and [card["id"] for card in cards] == [served]
    record = tmp_path / "record.jsonl"
    proxy_args = ["--backend", "vllm", "--vllm-url", server.base_url, "--record", str(record)]
    proxy_server = start_serve(
        mode="sample",
        logprobs_mode=LOGPROBS_MODE,
        model=model_dir,
        served_model_name=served,
        extra_args=proxy_args,
        log_path=tmp_path / "proxy.log",
        fork=True,
    )
    with (
        proxy_server as proxy,
        GymStack(["target_chars"], proxy.policy_model(), workdir=tmp_path / "ours") as stack,
    ):
        rows = stack.example_rows("target_chars") * ROLLOUTS_PER_ROW
        ours = _run_all(stack.directory.agent_url("target_chars_agent"), rows)
    plain_model = PolicyModel(base_url=server.base_url, model=served)
    with GymStack(["target_chars"], plain_model, workdir=tmp_path / "plain") as stack:
        plain = _run_all(stack.directory.agent_url("target_chars_agent"), rows)

    ours_drift = [_drift_turn(raw) for raw in ours]
    plain_drift = [_drift_turn(raw) for raw in plain]
    summary = {
        "rollouts": len(rows),
        "proxy_drifted": sum(d is not None for d in ours_drift),
        "plain_drifted": sum(d is not None for d in plain_drift),
        "plain_drift_turns": sorted(d for d in plain_drift if d is not None),
    }
    print(json.dumps(summary))
    for raw in ours:
        rollout = parse_agent_response(raw, EOS, on_drift=DriftPolicy.RAISE)
        assert rollout.num_turns == 3, rollout.error
        assert len(rollout.logprobs) == len(rollout.completion_ids)
    assert summary["proxy_drifted"] == 0
    assert summary["plain_drifted"] >= 1, summary

    # Every model turn through the proxy has a record: the seed and sampling it used.
    records = read_records(record)
    for raw in ours:
        for item in json.loads(raw)["response"]["output"]:
            if item.get("generation_token_ids"):
                key = turn_key(item["prompt_token_ids"], item["generation_token_ids"])
                entry = records[key]
                assert entry["logprobs_mode"] == LOGPROBS_MODE
                assert entry["sampled_model"] == served
                assert "seed" in entry["sampling"]  # type: ignore[operator]
