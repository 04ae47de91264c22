"""AgentClient and Verifier basics over real loopback HTTP (faults: test_client_faults.py)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from nemogym_sdk import (
    AgentClient,
    ConfigError,
    ParseOptions,
    RolloutStatus,
    SamplingParams,
    TaskRow,
    UnknownAgentError,
    Verifier,
    VerifyItem,
)
from nemogym_sdk.wire import build_response
from tests.fakes import agent_server, resources_server


def _row(i: int, agent: str | None = None, **params: Any) -> TaskRow:
    data: dict[str, Any] = {"responses_create_params": {"input": f"task {i}", **params}, "i": i}
    if agent is not None:
        data["agent_ref"] = {"type": "responses_api_agents", "name": agent}
    return TaskRow(row_id=f"rows.jsonl:{i}", data=data)


def test_run_sync_returns_groups_in_input_order() -> None:
    """Three rows x two generations come back aabbcc, tagged with row id and repeat index."""
    with agent_server() as agent, AgentClient({"a": agent.url}) as client:
        rollouts = client.run_sync([_row(i) for i in range(3)], eos_token_id=2, num_generations=2)
    assert [(r.row_id, r.repeat_index) for r in rollouts] == [
        (f"rows.jsonl:{i}", k) for i in range(3) for k in range(2)
    ]
    assert all(r.status is RolloutStatus.OK and r.agent_name == "a" for r in rollouts)
    assert sorted(b["i"] for b in agent.bodies) == [0, 0, 1, 1, 2, 2]


def test_sampling_parameters_override_rows_and_nulls_are_not_sent() -> None:
    """Caller sampling wins, unset caller values keep the row's, None row values are dropped."""
    row = _row(0, temperature=0.1, top_p=0.3, max_output_tokens=None)
    sampling = SamplingParams(temperature=1.0, max_output_tokens=32)
    with agent_server() as agent, AgentClient({"a": agent.url}, sampling=sampling) as client:
        client.run_sync([row], eos_token_id=2)
    (body,) = agent.bodies
    assert body["responses_create_params"] == {
        "input": "task 0",
        "temperature": 1.0,
        "top_p": 0.3,
        "max_output_tokens": 32,
    }


def test_group_affinity_sends_each_rows_id_as_the_routers_key() -> None:
    """With ``group_affinity`` every rollout of a row carries the row id in
    ``metadata.extra_body`` (what NeMo Gym's model server merges into its backend request),
    next to the row's own metadata; without it the body is the row's."""
    from nemogym_sdk.wire import affinity_key

    row = _row(0, metadata={"source": "tests", "extra_body": '{"top_k": 5}'})
    with (
        agent_server() as agent,
        AgentClient({"a": agent.url}, group_affinity=True) as client,
    ):
        client.run_sync([row, _row(1)], eos_token_id=2, num_generations=2)
    keys = []
    for body in agent.bodies:
        metadata = body["responses_create_params"]["metadata"]
        extra = json.loads(metadata["extra_body"])  # merged into the chat body by vllm_model
        keys.append(affinity_key(extra))
        if body["i"] == 0:
            assert metadata["source"] == "tests" and extra["top_k"] == 5
    assert sorted(keys) == ["rows.jsonl:0"] * 2 + ["rows.jsonl:1"] * 2
    assert row.data["responses_create_params"]["metadata"]["extra_body"] == '{"top_k": 5}'
    with agent_server() as agent, AgentClient({"a": agent.url}) as client:
        client.run_sync([_row(1)], eos_token_id=2)
    assert "metadata" not in agent.bodies[0]["responses_create_params"]


def test_unknown_agent_fails_before_sending() -> None:
    """A row naming an undeployed agent raises UnknownAgentError and nothing is sent."""
    with agent_server() as agent, AgentClient({"a": agent.url, "b": agent.url}) as client:
        with pytest.raises(UnknownAgentError, match="known agents: a, b"):
            client.run_sync([_row(0, "a"), _row(1, "zzz")], eos_token_id=2)
        with pytest.raises(UnknownAgentError, match="no default agent"):
            client.run_sync([_row(2)], eos_token_id=2)
        assert agent.bodies == []


def test_unknown_default_agent_is_rejected() -> None:
    """A default agent that does not exist is an error at construction."""
    with pytest.raises(UnknownAgentError):
        AgentClient({"a": "127.0.0.1:1"}, default_agent="b")


def test_connection_refused_is_a_transport_failure() -> None:
    """Nothing listening: every rollout comes back TRANSPORT_ERROR in the seed's shape."""
    from nemogym_sdk import RetryPolicy

    retry = RetryPolicy(max_attempts=2, base_delay=0.001)
    with AgentClient({"a": "127.0.0.1:9"}, retry=retry) as client:
        (rollout,) = client.run_sync([_row(0)], eos_token_id=2)
    assert rollout.status is RolloutStatus.TRANSPORT_ERROR
    assert rollout.completion_ids.tolist() == [2]
    assert rollout.error is not None and "after 2 attempts" in rollout.error


async def test_async_stream_yields_every_rollout() -> None:
    """stream() yields each rollout once, as it completes, from the caller's loop."""
    with agent_server() as agent:
        async with AgentClient({"a": agent.url}) as client:
            seen = [r async for r in client.stream([_row(i) for i in range(5)], eos_token_id=2)]
            again = await client.run([_row(9)], eos_token_id=2)
    assert sorted(r.row_id for r in seen) == sorted(f"rows.jsonl:{i}" for i in range(5))
    assert again[0].row_id == "rows.jsonl:9"


async def test_client_is_bound_to_one_loop() -> None:
    """Using an async-bound client from the sync facade is refused with a clear message."""
    with agent_server() as agent:
        client = AgentClient({"a": agent.url})
        await client.run([_row(0)], eos_token_id=2)
        with pytest.raises(ConfigError, match="async"):
            await asyncio.to_thread(client.run_sync, [_row(1)], eos_token_id=2)
        await client.aclose()


def test_verifier_seeds_a_session_per_item_and_keeps_the_row() -> None:
    """Each item gets its own /seed_session cookie on /verify; the row's params are untouched."""
    tools = [{"type": "function", "name": "get_weather", "parameters": {"type": "object"}}]
    row = {
        "responses_create_params": {
            "input": [{"role": "system", "content": "sys"}, {"role": "user", "content": "hi"}],
            "tools": tools,
            "metadata": {"k": "v"},
        },
        "expected": "x",
    }
    items = [
        VerifyItem(resources_server="env", row=row, completion=f"answer {i}") for i in range(3)
    ]
    with resources_server(reward=0.5, components={"a": 0.25, "b": 0.25}) as env:
        with Verifier({"env": env.url}) as verifier:
            results = verifier.verify_sync(items)
        assert sorted(c["session"] for c in env.cookies) == ["1", "2", "3"]
        for body in env.bodies:
            assert body["responses_create_params"] == row["responses_create_params"]
            assert body["response"]["tools"] == tools
    assert [r.reward for r in results] == [0.5, 0.5, 0.5]
    assert results[0].reward_components == {"a": 0.25, "b": 0.25}


def test_verifier_unknown_server_is_a_typed_failure() -> None:
    """An unknown resources server gives an INVALID result naming the known servers."""
    with Verifier({"env": "127.0.0.1:9"}) as verifier:
        (result,) = verifier.verify_sync([VerifyItem(resources_server="x", row={}, completion="a")])
    assert result.status is RolloutStatus.INVALID and result.reward is None
    assert result.error is not None and "known: env" in result.error


@pytest.mark.parametrize(
    ("completion", "types"),
    [
        ("plain", ["message"]),
        ("<think>hmm</think>answer", ["reasoning", "message"]),
        ("", ["message"]),
        (
            [
                {
                    "role": "assistant",
                    "content": "ok",
                    "tool_calls": [
                        {
                            "id": "c1",
                            "type": "function",
                            "function": {"name": "f", "arguments": {"x": 1}},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": "c1", "content": "{}"},
            ],
            ["message", "function_call", "function_call_output"],
        ),
        (
            [{"type": "function_call", "name": "f", "arguments": "{}", "call_id": "c"}],
            ["function_call"],
        ),
    ],
)
def test_build_response_shapes(completion: Any, types: list[str]) -> None:
    """Text, <think> text, chat messages with tool calls and raw items become Responses items."""
    response = build_response(completion, model="m")
    assert [item["type"] for item in response["output"]] == types
    assert response["object"] == "response" and response["model"] == "m"
    for item in response["output"]:
        if item["type"] == "function_call":
            assert isinstance(item["arguments"], str)


def test_unencodable_row_fails_before_sending() -> None:
    """A row JSON cannot encode raises DataError naming the row; nothing is sent."""
    from nemogym_sdk import DataError

    bad = TaskRow(row_id="rows.jsonl:7", data={"responses_create_params": {"input": object()}})
    with agent_server() as agent, AgentClient({"a": agent.url}) as client:
        with pytest.raises(DataError, match=r"rows\.jsonl:7"):
            client.run_sync([_row(0), bad], eos_token_id=2)
        assert agent.bodies == []


@pytest.mark.parametrize(
    ("header", "low", "high"),
    [("2", 2.0, 2.0), ("Wed, 21 Oct 2015 07:28:00 GMT", 0.0, 0.0), ("soon", None, None)],
)
def test_retry_after_accepts_seconds_and_http_dates(
    header: str, low: float | None, high: float | None
) -> None:
    """Retry-After is read as delta-seconds or an HTTP date (a past date means now)."""
    import email.utils
    import time

    from nemogym_sdk._net.aio import _retry_after

    value = _retry_after({"Retry-After": header})
    if low is None:
        assert value is None
    else:
        assert value is not None and low <= value <= high
    future = email.utils.formatdate(time.time() + 30, usegmt=True)
    in_future = _retry_after({"Retry-After": future})
    assert in_future is not None and 25 <= in_future <= 31


def test_parse_options_travel_as_one_record() -> None:
    """``parse=ParseOptions(...)`` reaches the parser on every path (``run_sync`` and
    ``RawRun.rollout``), and a parsed exchange is tagged like ``run_sync``'s rollouts."""
    options = ParseOptions(max_completion_length=1)
    with agent_server() as agent, AgentClient({"a": agent.url}) as client:
        (rollout,) = client.run_sync([_row(0)], eos_token_id=2, parse=options)
        (untruncated,) = client.run_sync([_row(0)], eos_token_id=2)
        (raw,) = client.run_raw_sync([_row(0)])
    assert rollout.truncated and len(rollout.completion_ids) == 1
    assert not untruncated.truncated and len(untruncated.completion_ids) > 1
    assert raw.rollout(2, options) == rollout
    assert (rollout.row_id, rollout.repeat_index, rollout.agent_name) == ("rows.jsonl:0", 0, "a")


def test_agent_client_public_methods() -> None:
    """Play and parse is one method per calling style (``play``: one episode under its own
    deadline, what ``RolloutEngine`` plays with); the raw exchanges stay available for users
    who parse ``/run`` bodies themselves; nothing else is public."""
    public = {
        name
        for name in dir(AgentClient)
        if not name.startswith("_") and callable(getattr(AgentClient, name))
    }
    assert public == {
        "aclose",
        "close",
        "play",
        "run",
        "run_raw",
        "run_raw_sync",
        "run_sync",
        "stream",
    }


def test_several_deployments_balance_rows_and_route_by_agent() -> None:
    """Two deployments running agent ``a`` (the second also ``b``): ``a``'s rollouts spread
    over both, ``b``'s go where ``b`` runs, and each raw exchange says where it played."""
    from nemogym_sdk import ServerDirectory

    with agent_server() as first, agent_server() as second:
        deployments = [
            ServerDirectory.from_urls(agents={"a": first.url}),
            ServerDirectory.from_urls(agents={"a": second.url, "b": second.url}),
        ]
        with AgentClient(deployments) as client:
            assert client.agent_urls == {"a": (first.url, second.url), "b": (second.url,)}
            rows = [_row(i, "a") for i in range(8)] + [_row(8, "b")]
            raw = client.run_raw_sync(rows, num_generations=4)
    assert all(r.status is RolloutStatus.OK for r in raw)
    on_first = sum(r.url == f"{first.url}/run" for r in raw if r.agent_name == "a")
    assert 8 <= on_first <= 24  # 32 rollouts of a, spread over two deployments
    assert {r.url for r in raw if r.agent_name == "b"} == {f"{second.url}/run"}
    assert len(first.bodies) + len(second.bodies) == 36


def test_a_deployment_that_goes_away_costs_no_rollout_and_no_hang() -> None:
    """Deployment 1 stops answering: its rollouts are played by deployment 2 (a refused
    connection started nothing), the client marks it unreachable; with both gone, every
    rollout comes back as a typed ``TRANSPORT_ERROR`` within the retry budget."""
    import time

    from nemogym_sdk import RetryPolicy, ServerDirectory

    with agent_server() as survivor:
        with agent_server() as doomed:
            gone = doomed.url
        deployments = [
            ServerDirectory.from_urls(agents={"a": gone}),
            ServerDirectory.from_urls(agents={"a": survivor.url}),
        ]
        retry = RetryPolicy(max_attempts=2, base_delay=0.01)
        with AgentClient(deployments, retry=retry) as client:
            rollouts = client.run_sync([_row(i, "a") for i in range(6)], eos_token_id=2)
            assert all(r.status is RolloutStatus.OK for r in rollouts)
            assert client.unreachable == [f"{gone}/run"]
    assert len(survivor.bodies) == 6
    with AgentClient([ServerDirectory.from_urls(agents={"a": gone})] * 2, retry=retry) as client:
        began = time.monotonic()
        failed = client.run_sync([_row(0, "a")], eos_token_id=2, num_generations=3)
    assert time.monotonic() - began < 10
    assert {r.status for r in failed} == {RolloutStatus.TRANSPORT_ERROR}
    assert all(r.error and "attempts" in r.error for r in failed)
