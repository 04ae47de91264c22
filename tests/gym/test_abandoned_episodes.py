"""An episode the trainer gives up on stops costing the sampler, through real NeMo Gym.

``target_chars`` plays three rounds, each a model turn; here every turn asks for 3,000
tokens (``ignore_eos``), far more than the 3 s the client waits. NeMo Gym's agent plays on
after the client has gone: without an abort the sampler keeps generating for nobody; with
``AgentClient(sampler_url=...)`` the turn in flight stops and the later rounds are refused.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import requests

from nemogym_sdk import AgentClient, RetryPolicy, RolloutStatus, TaskRow, Timeouts
from nemogym_sdk.data import read_rows
from nemogym_sdk.lora import LoraSync
from nemogym_sdk.wire import RESPONSES_CREATE_PARAMS, with_episode
from tests.lora_models import tiny_lora

from .deployment import ToyDeployment

pytestmark = pytest.mark.gym

EOS = 257
WAIT_S = 3.0


def _long_rows(toy: ToyDeployment, n: int) -> list[TaskRow]:
    """``n`` rows whose every turn asks for 3,000 tokens, whatever the model samples."""
    rows = []
    for row in read_rows(toy.train_file)[:n]:
        params = dict(row.data[RESPONSES_CREATE_PARAMS], max_output_tokens=3000)
        params["metadata"] = {"extra_body": json.dumps({"ignore_eos": True})}
        rows.append(TaskRow(row_id=row.row_id, data={**row.data, RESPONSES_CREATE_PARAMS: params}))
    return rows


def _tokens(toy: ToyDeployment) -> int:
    root = toy.sampler.base_url.removesuffix("/v1")
    text = requests.get(f"{root}/metrics", timeout=10).text
    line = next(x for x in text.splitlines() if x.startswith("nemogym_serve_generation_tokens"))
    return int(line.split()[1])


def _generated_after(toy: ToyDeployment, client: AgentClient, rows: list[Any]) -> int:
    """Tokens the sampler generates in the 2 s after the client gave up on ``rows``."""
    with client:  # closed, it has sent its aborts
        rollouts = client.run_sync(rows, eos_token_id=EOS)
    assert {r.status for r in rollouts} == {RolloutStatus.TIMEOUT}, [r.error for r in rollouts]
    start = _tokens(toy)
    time.sleep(2.0)
    return _tokens(toy) - start


def test_an_abandoned_episode_stops_costing_the_sampler(
    toy_deployment: ToyDeployment, tmp_path: Path
) -> None:
    """Two episodes abandoned at 3 s: without the abort the sampler generates hundreds of
    tokens in the next 2 s; with it, at most the one token each turn in flight was being
    drawn when the abort came."""
    toy, directory = toy_deployment, toy_deployment.stack.directory
    LoraSync(toy.sampler.base_url, "policy", tmp_path).initialize(tiny_lora())  # the name rows use
    settings: dict[str, Any] = {
        "timeouts": Timeouts(request=WAIT_S),
        "retry": RetryPolicy(max_attempts=1),
    }
    # before: episodes stamped with ids by hand (to stop them afterwards), no abort
    rows = _long_rows(toy, 2)
    manual = [
        TaskRow(row_id=r.row_id, data=with_episode(r.data, f"manual-{i}"))
        for i, r in enumerate(rows)
    ]
    played_on = _generated_after(toy, AgentClient(directory, **settings), manual)
    root = toy.sampler.base_url.removesuffix("/v1")
    for i in range(len(manual)):
        requests.post(f"{root}/abort_episode", params={"episode_id": f"manual-{i}"}, timeout=10)
    time.sleep(0.5)
    client = AgentClient(directory, sampler_url=toy.sampler.base_url, **settings)
    stopped = _generated_after(toy, client, rows)
    assert played_on > 100, played_on
    assert stopped <= len(rows), stopped
