"""End to end against real NeMo Gym: discovery, AgentClient, parser, collate, Verifier.

One head-mode stack of six shipped environments (five ``simple_agent`` ones and the
``gymnasium_agent`` Wordle) behind the scripted CPU model server. The SDK discovers it
through NeMo Gym's own head server, plays every environment's example rows, parses the
raw ``/run`` bytes with the RAISE drift policy (so every multi-turn rollout passes the
prefix check), and checks that each environment span of the env mask holds exactly the
tool outputs and observations NeMo Gym reported between those model turns.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from nemogym_sdk import (
    AgentClient,
    DriftPolicy,
    ParseOptions,
    RawRun,
    Rollout,
    RolloutStatus,
    SamplingParams,
    ServerDirectory,
    TaskRow,
    Timeouts,
    Verifier,
    VerifyItem,
    collate,
    load_rows,
    parse_agent_response,
    reward_nemo_gym_verify,
    verify_stats,
)
from nemogym_sdk.gym import GymStack

from .stacks import StackFactory, head_url

pytestmark = [pytest.mark.gym, pytest.mark.slow]

ENVIRONMENTS = [
    "example_single_tool_call",
    "example_multi_step",
    "example_session_state_mgmt",
    "example_tool_call_multireward",
    "workplace_assistant",
    "wordle",
]
LONG_PROMPTS = {"example_multi_step", "workplace_assistant"}  # 11k-16k token prompts
EOS = 258  # <|im_end|> of the tiny tokenizer the scripted server uses


@pytest.fixture(scope="module")
def stack(stack_factory: StackFactory) -> Iterator[GymStack]:
    """The six environments and NeMo Gym's head server."""
    with stack_factory(ENVIRONMENTS, head_server=True) as started:
        yield started


@pytest.fixture(scope="module")
def directory(stack: GymStack) -> ServerDirectory:
    """The deployment as the SDK discovers it from the head server."""
    return ServerDirectory.from_head(head_url(stack), wait=60)


@pytest.fixture(scope="module")
def played(stack: GymStack, directory: ServerDirectory) -> dict[str, list[RawRun]]:
    """Each environment's example rows played through AgentClient: raw exchanges by env."""
    rows: list[TaskRow] = []
    for environment in ENVIRONMENTS:
        examples = stack.example_rows(environment)
        count = 1 if environment in LONG_PROMPTS else 2
        for index, data in enumerate(examples[:count]):
            data = dict(data)
            data.setdefault("agent_ref", {"name": stack.environment(environment).agent})
            rows.append(TaskRow(row_id=f"{environment}:{index}", data=data))
    sampling = SamplingParams(temperature=1.0, top_p=1.0)
    with AgentClient(
        directory, sampling=sampling, timeouts=Timeouts(request=600.0, total=1500.0)
    ) as client:
        raws = client.run_raw_sync(rows, num_generations=2)
    by_env: dict[str, list[RawRun]] = {env: [] for env in ENVIRONMENTS}
    for raw in raws:
        by_env[raw.request.row.row_id.split(":")[0]].append(raw)
    return by_env


def _parse(raw: RawRun) -> Rollout:
    rollout = raw.rollout(EOS, ParseOptions(on_drift=DriftPolicy.RAISE))
    assert rollout.status is RolloutStatus.OK, rollout.error
    return rollout


def test_discovery_finds_every_agent_and_resources_server(
    stack: GymStack, directory: ServerDirectory
) -> None:
    """ServerDirectory lists the stack's agents and resources servers at their real URLs."""
    assert directory.agents == stack.directory.agents
    assert directory.resources_servers == stack.directory.resources_servers
    assert set(directory.agents) == {a for e in stack.environments for a in e.agents}
    for agent in directory.agents:
        assert directory.resources_server_of(agent) in directory.resources_servers


def test_the_stack_and_the_head_describe_one_deployment(
    stack: GymStack, directory: ServerDirectory
) -> None:
    """``stack.directory`` (built locally) and discovery through the head agree on every
    server; ``stack.task_rows`` ids are ``load_rows`` ids, for every environment."""
    local = stack.directory
    assert [(s.name, s.server_type, s.implementation, s.url) for s in local.servers()] == [
        (s.name, s.server_type, s.implementation, s.url) for s in directory.servers()
    ]
    for agent in local.agents:
        assert local.resources_server_of(agent) == directory.resources_server_of(agent)
    for environment in ENVIRONMENTS:
        rows = stack.task_rows(environment)
        assert [r.row_id for r in rows] == [
            r.row_id for r in load_rows(stack.example_paths[environment])
        ]


@pytest.mark.parametrize("environment", ENVIRONMENTS)
def test_rollouts_come_back_ok_and_contiguous(
    played: dict[str, list[RawRun]], environment: str
) -> None:
    """Every rollout is OK, multi-turn, and passes the prefix check (RAISE policy)."""
    raws = played[environment]
    assert len(raws) == (2 if environment in LONG_PROMPTS else 4)
    for raw in raws:
        assert raw.status is RolloutStatus.OK, raw.error
        rollout = _parse(raw)
        assert rollout.num_turns >= 2, "scripted runs call tools before answering"
        assert rollout.agent_name is not None and rollout.row_id == raw.request.row.row_id
        assert int(rollout.env_mask.sum()) == sum(
            len(item["generation_token_ids"])
            for item in raw.json()["response"]["output"]
            if item.get("generation_token_ids")
        )


def _env_texts(output: list[dict[str, Any]]) -> list[list[str]]:
    """Texts NeMo Gym put between consecutive model turns (tool outputs, observations)."""
    gaps: list[list[str]] = []
    current: list[str] | None = None
    for item in output:
        if item.get("generation_token_ids"):
            if current is not None:
                gaps.append(current)
            current = []
        elif current is not None and item.get("type") == "function_call_output":
            current.append(str(item["output"]))
        elif current is not None and item.get("role") == "user":
            content = item.get("content")
            current.append(content if isinstance(content, str) else content[0]["text"])
    return gaps


def _spans(rollout: Rollout, value: int) -> list[np.ndarray]:
    """Maximal runs of completion tokens whose env mask equals ``value``."""
    mask = rollout.env_mask
    edges = np.flatnonzero(np.diff(np.concatenate([[1 - value], mask, [1 - value]]) != 0))
    runs = []
    for start, stop in zip(edges[::2], edges[1::2], strict=True):
        if mask[start] == value:
            runs.append(rollout.completion_ids[start:stop])
    return runs


@pytest.mark.parametrize("environment", ENVIRONMENTS)
def test_env_mask_spans_hold_the_tool_outputs(
    played: dict[str, list[RawRun]], environment: str
) -> None:
    """The k-th env span decodes to text containing exactly the k-th gap's tool outputs."""
    from nemogym_sdk.serve import build_tiny_tokenizer

    tokenizer = build_tiny_tokenizer()
    for raw in played[environment]:
        rollout = _parse(raw)
        output = raw.json()["response"]["output"]
        gaps = _env_texts(output)
        env_spans = [tokenizer.decode(span.tolist()) for span in _spans(rollout, 0)]
        assert len(env_spans) == len(gaps) == rollout.num_turns - 1
        assert any(gaps), "a scripted run returns tool outputs between its turns"
        for texts, span in zip(gaps, env_spans, strict=True):
            for text in texts:
                assert text in span
        model_spans = [tokenizer.decode(span.tolist()) for span in _spans(rollout, 1)]
        calls = [item for item in output if item.get("type") == "function_call"]
        for call in calls:
            assert any(f'"name": "{call["name"]}"' in span for span in model_spans)


@pytest.mark.parametrize("environment", ENVIRONMENTS)
def test_rewards_and_components_arrive(played: dict[str, list[RawRun]], environment: str) -> None:
    """Rollout rewards equal NeMo Gym's; reward_components survive into the batch."""
    rollouts = [_parse(raw) for raw in played[environment]]
    for raw, rollout in zip(played[environment], rollouts, strict=True):
        result = raw.json()
        assert rollout.reward == pytest.approx(result["reward"])
        assert rollout.reward_components == result.get("reward_components", {})
    batch = collate(rollouts, pad_token_id=0)
    assert batch.ok.all() and np.allclose(batch.rewards, [r.reward for r in rollouts])
    if environment == "example_tool_call_multireward":
        assert set(batch.reward_components) == {"correctness", "schema_valid", "format"}
        totals = sum(batch.reward_components[name] for name in batch.reward_components)
        assert np.allclose(totals, batch.rewards)
    if environment == "example_single_tool_call":
        assert (batch.rewards == 1.0).all()  # the scripted policy calls get_weather


def test_bytes_and_dict_parsing_agree_on_real_results(played: dict[str, list[RawRun]]) -> None:
    """The simdjson bytes path and the dict path give identical rollouts on real output."""
    for raws in played.values():
        for raw in raws:
            assert raw.body is not None
            from_bytes = parse_agent_response(raw.body, EOS)
            assert from_bytes == parse_agent_response(raw.json(), EOS)


def _weather_row(stack: GymStack, environment: str) -> dict[str, Any]:
    return stack.example_rows(environment)[0]


def _resources_name(stack: GymStack, environment: str) -> str:
    (name,) = stack.environment(environment).resources_servers
    return name


def test_verifier_scores_on_real_resources_servers(
    stack: GymStack, directory: ServerDirectory
) -> None:
    """/seed_session + /verify: the weather rule, the three multireward components, state."""
    weather = _resources_name(stack, "example_single_tool_call")
    multi = _resources_name(stack, "example_tool_call_multireward")
    counter = _resources_name(stack, "example_session_state_mgmt")
    call = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "c1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "San Francisco"}'},
            }
        ],
    }
    items = [
        VerifyItem(
            resources_server=weather,
            row=_weather_row(stack, "example_single_tool_call"),
            completion=[call],
        ),
        VerifyItem(
            resources_server=weather,
            row=_weather_row(stack, "example_single_tool_call"),
            completion="It is sunny.",
        ),
        VerifyItem(
            resources_server=multi,
            row=_weather_row(stack, "example_tool_call_multireward"),
            completion=[call],
        ),
        VerifyItem(
            resources_server=counter,
            row=_weather_row(stack, "example_session_state_mgmt"),
            completion="The count is 3.",
        ),
    ]
    with Verifier(directory) as verifier:
        results = verifier.verify_sync(items)
    assert [r.status for r in results] == [RolloutStatus.OK] * 4, [r.error for r in results]
    assert [r.reward for r in results[:2]] == [1.0, 0.0]
    assert results[2].reward == 3.0
    assert results[2].reward_components == {"correctness": 1.0, "schema_valid": 1.0, "format": 1.0}
    # the counter was seeded from the row (3) but never incremented: a real 0.0, not a failure
    assert results[3].reward == 0.0 and not math.isnan(results[3].reward)


def test_reward_function_discovers_through_the_head(stack: GymStack) -> None:
    """reward_nemo_gym_verify finds resources servers via the head and scores in order."""
    weather = _resources_name(stack, "example_single_tool_call")
    row = _weather_row(stack, "example_single_tool_call")
    call = {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}
        ],
    }
    unscored_before, scored_before = verify_stats.unscored, verify_stats.scored
    rewards = reward_nemo_gym_verify(
        [[call], [{"role": "assistant", "content": "no tool"}], [call]],
        resources_server_ref=[{"name": weather}, {"name": weather}, {"name": "missing"}],
        verify_extra=[row, row, row],
        head=head_url(stack),
    )
    assert rewards == [1.0, 0.0, 0.0]
    # the unknown server's 0.0 is counted as unscored; the real 0.0 is a score
    assert verify_stats.unscored - unscored_before == 1
    assert verify_stats.scored - scored_before == 2
