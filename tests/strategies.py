"""Hypothesis strategies: the one place every property test draws its data from.

``episodes()`` generates NeMo Gym ``/run`` results of one to several model turns, with
tool outputs and reasoning items between them, either contiguous (each prompt extends
the history) or drifting (some prompts re-render the history differently), together
with the token facts a correct parser must reproduce. ``json_values()`` and
``mangled_responses()`` feed the "never raises" properties. When a record gains a
field, give it a strategy here.
"""

from __future__ import annotations

import copy
from typing import Any

import attrs
from hypothesis import strategies as st

from nemogym_sdk import Rollout, RolloutStatus

TOKENS = st.integers(min_value=3, max_value=50_000)
LOGPROBS = st.floats(min_value=-30.0, max_value=0.0, allow_nan=False, allow_infinity=False)
REWARDS = st.floats(min_value=-10.0, max_value=10.0, allow_nan=False, allow_infinity=False)


@attrs.frozen(kw_only=True)
class Episode:
    """A generated ``/run`` result and the per-turn token facts behind it."""

    response: dict[str, Any]
    prompts: tuple[tuple[int, ...], ...]
    """Each model turn's ``prompt_token_ids``."""
    generations: tuple[tuple[int, ...], ...]
    """Each model turn's ``generation_token_ids``."""
    logprobs: tuple[tuple[float, ...], ...]
    """Each model turn's ``generation_log_probs``."""
    drift_turns: frozenset[int]
    """Turns whose prompt does not start with the previous prompt + generation."""
    reward: float

    def history(self, turn: int) -> tuple[int, ...]:
        """Previous turn's prompt + generation, as seen before ``turn``."""
        return self.prompts[turn - 1] + self.generations[turn - 1]

    def segments(self) -> list[list[int]]:
        """Model turn indices grouped into samples, a new one at every drift turn."""
        groups: list[list[int]] = [[0]]
        for turn in range(1, len(self.prompts)):
            if turn in self.drift_turns:
                groups.append([turn])
            else:
                groups[-1].append(turn)
        return groups

    def expected_sample(self, turns: list[int]) -> dict[str, list[Any]]:
        """What a contiguous run of ``turns`` must stitch into."""
        completion: list[int] = []
        mask: list[int] = []
        logprobs: list[float] = []
        for turn in turns:
            if turn != turns[0]:
                delta = self.prompts[turn][len(self.history(turn)) :]
                completion += delta
                mask += [0] * len(delta)
                logprobs += [0.0] * len(delta)
            completion += self.generations[turn]
            mask += [1] * len(self.generations[turn])
            logprobs += self.logprobs[turn]
        return {
            "prompt_ids": list(self.prompts[turns[0]]),
            "completion_ids": completion,
            "env_mask": mask,
            "logprobs": logprobs,
        }


def _extends(prompt: list[int], history: list[int]) -> bool:
    return prompt[: len(history)] == history


@st.composite
def _next_prompt(draw: st.DrawFn, history: list[int], drift: bool) -> list[int]:
    delta = draw(st.lists(TOKENS, max_size=8))
    if not drift or not draw(st.booleans()):
        return history + delta
    how = draw(st.sampled_from(["change", "cut", "insert"]))
    body = list(history)
    if how == "change":
        i = draw(st.integers(0, len(body) - 1))
        body[i] = body[i] + 1
    elif how == "cut":
        body = body[: draw(st.integers(0, len(body) - 1))]
    else:
        i = draw(st.integers(0, len(body) - 1))
        body.insert(i, draw(TOKENS))
    return body + delta


def _non_model_item(kind: str, turn: int) -> dict[str, Any]:
    if kind == "function_call_output":
        return {"type": "function_call_output", "call_id": f"call_{turn}", "output": '{"ok":1}'}
    return {"type": "reasoning", "id": f"rs_{turn}", "summary": [{"type": "summary_text"}]}


def _model_item(kind: str, turn: int, prompt: list[int], gen: list[int], lps: list[float]) -> Any:
    if kind == "function_call":
        head = {"type": "function_call", "name": "tool", "arguments": "{}", "call_id": f"c{turn}"}
    else:
        text = {"type": "output_text", "text": f"answer {turn}", "annotations": []}
        head = {"type": "message", "role": "assistant", "content": [text]}
    return head | {
        "prompt_token_ids": prompt,
        "generation_token_ids": gen,
        "generation_log_probs": lps,
    }


@st.composite
def episodes(draw: st.DrawFn, *, drift: bool = False, max_turns: int = 6) -> Episode:
    """A ``/run`` result with 1..``max_turns`` model turns (drifting ones when ``drift``)."""
    n_turns = draw(st.integers(1, max_turns))
    prompts: list[list[int]] = []
    generations: list[list[int]] = []
    logprobs: list[list[float]] = []
    drift_turns: set[int] = set()
    output: list[dict[str, Any]] = []
    for turn in range(n_turns):
        if turn == 0:
            prompt = draw(st.lists(TOKENS, min_size=1, max_size=12))
        else:
            history = prompts[-1] + generations[-1]
            prompt = draw(_next_prompt(history, drift))
            if not _extends(prompt, history):
                drift_turns.add(turn)
        generation = draw(st.lists(TOKENS, min_size=1, max_size=8))
        lps = draw(st.lists(LOGPROBS, min_size=len(generation), max_size=len(generation)))
        for kind in draw(
            st.lists(st.sampled_from(["function_call_output", "reasoning"]), max_size=2)
        ):
            output.append(_non_model_item(kind, turn))
        kind = draw(st.sampled_from(["function_call", "message"]))
        output.append(_model_item(kind, turn, prompt, generation, lps))
        prompts.append(prompt)
        generations.append(generation)
        logprobs.append(lps)
    reward = draw(REWARDS)
    response = {
        "responses_create_params": {"input": "hi"},
        "response": {"output": output},
        "reward": reward,
    }
    return Episode(
        response=response,
        prompts=tuple(map(tuple, prompts)),
        generations=tuple(map(tuple, generations)),
        logprobs=tuple(map(tuple, logprobs)),
        drift_turns=frozenset(drift_turns),
        reward=reward,
    )


def json_values(max_leaves: int = 30) -> st.SearchStrategy[Any]:
    """Arbitrary JSON-like values (what a broken server might send)."""
    scalars = (
        st.none()
        | st.booleans()
        | st.integers(min_value=-(2**70), max_value=2**70)
        | st.floats()
        | st.text(max_size=8)
    )
    keys = st.sampled_from(
        [
            "response",
            "output",
            "reward",
            "error",
            "type",
            "mask_sample",
            "reward_components",
            "prompt_token_ids",
            "generation_token_ids",
            "generation_log_probs",
            "content",
            "text",
            "function_call",
            "message",
            "output_text",
        ]
    ) | st.text(max_size=4)
    return st.recursive(
        scalars,
        lambda children: (
            st.lists(children, max_size=4) | st.dictionaries(keys, children, max_size=4)
        ),
        max_leaves=max_leaves,
    )


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [prefix]
    if isinstance(value, dict):
        for key, child in value.items():
            found += _paths(child, (*prefix, key))
    elif isinstance(value, list):
        for index, child in enumerate(value):
            found += _paths(child, (*prefix, index))
    return found


@st.composite
def mangled_responses(draw: st.DrawFn) -> Any:
    """A valid episode with one to three of its subtrees replaced by arbitrary JSON."""
    response: Any = copy.deepcopy(draw(episodes(drift=True, max_turns=3)).response)
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(_paths(response)))
        junk = draw(json_values(max_leaves=6))
        if not path:
            response = junk
            continue
        parent = response
        try:
            for step in path[:-1]:
                parent = parent[step]
            parent[path[-1]] = junk
        except (KeyError, IndexError, TypeError):
            continue
    return response


def rollouts() -> st.SearchStrategy[Rollout]:
    """Rollouts of any status and length, for collation properties."""

    @st.composite
    def build(draw: st.DrawFn) -> Rollout:
        n_prompt = draw(st.integers(1, 10))
        n_completion = draw(st.integers(0, 12))
        return Rollout(
            prompt_ids=draw(st.lists(TOKENS, min_size=n_prompt, max_size=n_prompt)),
            completion_ids=draw(st.lists(TOKENS, min_size=n_completion, max_size=n_completion)),
            env_mask=draw(
                st.lists(st.integers(0, 1), min_size=n_completion, max_size=n_completion)
            ),
            logprobs=draw(st.lists(LOGPROBS, min_size=n_completion, max_size=n_completion)),
            reward=draw(REWARDS),
            num_turns=draw(st.integers(0, 5)),
            status=draw(st.sampled_from(list(RolloutStatus))),
            truncated=draw(st.booleans()),
            reward_components=draw(st.dictionaries(st.sampled_from(["a", "b"]), REWARDS)),
            row_id=draw(st.none() | st.text(min_size=1, max_size=6)),
            repeat_index=draw(st.none() | st.integers(0, 7)),
        )

    return build()


# --- GRPO: rewards in groups -------------------------------------------------------------

GRID_REWARDS = st.integers(min_value=-80, max_value=80).map(lambda k: k / 8)
"""Rewards on a 1/8 grid in [-10, 10]: group sums are exact, so shifting every reward by a
grid constant moves the float64 results by a few ulps only (no catastrophic cancellation
between nearly equal rewards)."""
BINARY_OR_REWARDS = st.sampled_from([0.0, 1.0]) | REWARDS
"""Mostly 0/1 rewards (ties and zero-spread groups are common), otherwise any reward."""
BINARY_OR_GRID = st.sampled_from([0.0, 1.0]) | GRID_REWARDS
"""Like ``BINARY_OR_REWARDS`` on the exact 1/8 grid."""
FAILED_STATUSES = st.sampled_from([s for s in RolloutStatus if s is not RolloutStatus.OK])


@attrs.frozen(kw_only=True)
class RewardGroups:
    """Episodes of one to several groups, interleaved: the inputs of ``group_advantages``."""

    rewards: tuple[float, ...]
    """``[N]`` episode rewards (failed episodes carry a placeholder)."""
    groups: tuple[str, ...]
    """``[N]`` row id of each episode's group."""
    ok: tuple[bool, ...]
    """``[N]`` whether the episode is ``OK``."""

    def __len__(self) -> int:
        return len(self.rewards)

    def members(self, group: str) -> list[int]:
        """Positions of ``group``'s episodes, in order."""
        return [i for i, g in enumerate(self.groups) if g == group]

    def ok_members(self, group: str) -> list[int]:
        """Positions of ``group``'s ``OK`` episodes, in order."""
        return [i for i in self.members(group) if self.ok[i]]


@st.composite
def reward_groups(
    draw: st.DrawFn,
    *,
    rewards: st.SearchStrategy[float] = BINARY_OR_REWARDS,
    max_groups: int = 4,
    max_group_size: int = 6,
) -> RewardGroups:
    """1..``max_groups`` groups (``row:0``, ``row:1`` ...) of 1..``max_group_size``
    episodes each, about one in four failed, in a random interleaved order."""
    entries: list[tuple[float, str, bool]] = []
    for g in range(draw(st.integers(1, max_groups))):
        for _ in range(draw(st.integers(1, max_group_size))):
            ok = draw(st.sampled_from([True, True, True, False]))
            entries.append((draw(rewards), f"row:{g}", ok))
    order = draw(st.permutations(range(len(entries))))
    shuffled = [entries[i] for i in order]
    return RewardGroups(
        rewards=tuple(e[0] for e in shuffled),
        groups=tuple(e[1] for e in shuffled),
        ok=tuple(e[2] for e in shuffled),
    )


def scored_rollout(
    row_id: str,
    reward: float,
    *,
    repeat_index: int = 0,
    status: RolloutStatus = RolloutStatus.OK,
) -> Rollout:
    """A tiny rollout of ``row_id``: one prompt and one policy token when ``OK``, the seed's
    one-token failure shape otherwise."""
    if status is RolloutStatus.OK:
        rollout = Rollout(
            prompt_ids=[5], completion_ids=[7], env_mask=[1], logprobs=[-0.5], reward=reward
        )
    else:
        rollout = Rollout.failed(status, 2, error="generated failure", reward=reward)
    return attrs.evolve(rollout, row_id=row_id, repeat_index=repeat_index)


@st.composite
def grouped_rollouts(draw: st.DrawFn, *, max_groups: int = 4) -> list[Rollout]:
    """Rollouts of 1..``max_groups`` interleaved groups, tagged with ``row_id`` and
    ``repeat_index``; about one in four failed, with any status and placeholder reward."""
    data = draw(reward_groups(max_groups=max_groups))
    repeats: dict[str, int] = {}
    rollouts: list[Rollout] = []
    for reward, group, ok in zip(data.rewards, data.groups, data.ok, strict=True):
        repeat = repeats[group] = repeats.get(group, -1) + 1
        status = RolloutStatus.OK if ok else draw(FAILED_STATUSES)
        rollouts.append(scored_rollout(group, reward, repeat_index=repeat, status=status))
    return rollouts
