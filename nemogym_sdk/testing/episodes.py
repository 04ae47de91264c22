"""Hypothesis strategies for well-formed and drifting NeMo Gym ``/run`` results.

``episodes()`` draws a ``/run`` result of one to several model turns, with tool outputs
and reasoning items between them, together with its ground truth (``Episode``): every
turn's prompt, generation and logprobs, which turns drift and how, and the exact sample
a correct parser must stitch. Tokens are small integers, so a shrunk counterexample
reads like the drawings in the docs::

    turn 0   prompt [3]        generation [4]
    turn 1   prompt [3 4 5]    generation [6]      5 is an environment token

    prompt_ids [3]   completion_ids [4 5 6]   env_mask [1 0 1]
"""

from __future__ import annotations

from typing import Any, Literal

import attrs
from hypothesis import strategies as st

__all__ = [
    "DRIFT_KINDS",
    "JSON_REWARDS",
    "LOGPROBS",
    "REWARDS",
    "TOKENS",
    "Episode",
    "drifted_episodes",
    "episodes",
]

TOKENS = st.integers(min_value=3, max_value=50_000)
"""Token ids (0-2 are left for pad, bos and eos)."""
LOGPROBS = st.floats(min_value=-30.0, max_value=0.0, allow_nan=False, allow_infinity=False)
"""Sampling logprobs."""
REWARDS = st.floats(min_value=-10.0, max_value=10.0, allow_nan=False, allow_infinity=False)
"""Rewards as floats (``Rollout`` records, reward groups)."""
JSON_REWARDS = REWARDS | st.integers(min_value=-10, max_value=10)
"""Episode rewards as a ``/run`` result carries them: floats, and integers (an environment
that returns ``1`` sends JSON ``1``, which decodes to ``int``, not ``1.0``)."""

DriftKind = Literal["retokenized", "stripped", "rerendered"]
DRIFT_KINDS: tuple[DriftKind, ...] = ("retokenized", "stripped", "rerendered")
"""How a drifting prompt differs from the history: one token changed (a re-tokenization),
the history cut short (stripped reasoning), or a token inserted (a re-rendered template)."""


@attrs.frozen(kw_only=True)
class Episode:
    """A generated ``/run`` result and the per-turn token facts behind it."""

    response: dict[str, Any]
    """The ``/run`` result as NeMo Gym's agent returns it (a fresh dict per draw)."""
    prompts: tuple[tuple[int, ...], ...]
    """Each model turn's ``prompt_token_ids``."""
    generations: tuple[tuple[int, ...], ...]
    """Each model turn's ``generation_token_ids``."""
    logprobs: tuple[tuple[float, ...], ...]
    """Each model turn's ``generation_log_probs``."""
    drift_turns: frozenset[int]
    """Turns whose prompt does not start with the previous prompt + generation."""
    drift_kinds: tuple[tuple[int, DriftKind], ...] = ()
    """``(turn, kind)`` of every drifting turn, in turn order."""
    reward: float
    """The ``reward`` field as sent: a float, or an ``int`` when JSON carried an integer."""

    @property
    def num_turns(self) -> int:
        """Number of model turns."""
        return len(self.prompts)

    def history(self, turn: int) -> tuple[int, ...]:
        """Previous turn's prompt + generation, as seen before ``turn``."""
        return self.prompts[turn - 1] + self.generations[turn - 1]

    def segments(self) -> list[list[int]]:
        """Model turn indices grouped into samples, a new one at every drift turn."""
        groups: list[list[int]] = [[0]]
        for turn in range(1, self.num_turns):
            if turn in self.drift_turns:
                groups.append([turn])
            else:
                groups[-1].append(turn)
        return groups

    def expected_sample(self, turns: list[int] | None = None) -> dict[str, list[Any]]:
        """What a contiguous run of ``turns`` (default: all) must stitch into: the seed's
        ``prompt_ids``, ``completion_ids``, ``env_mask`` and ``logprobs``."""
        turns = list(range(self.num_turns)) if turns is None else turns
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

    def describe(self) -> str:
        """The episode drawn turn by turn with its tokens (for failure messages)."""
        lines = [f"reward {self.reward!r} ({type(self.reward).__name__}), {self.num_turns} turns"]
        kinds = dict(self.drift_kinds)
        for turn in range(self.num_turns):
            note = f"   <- drifts ({kinds.get(turn, 'drift')})" if turn in self.drift_turns else ""
            lines.append(
                f"turn {turn}: prompt {_ids(self.prompts[turn])} generation "
                f"{_ids(self.generations[turn])} logprobs {list(self.logprobs[turn])}{note}"
            )
        return "\n".join(lines)


def _ids(tokens: tuple[int, ...] | list[int]) -> str:
    return "[" + " ".join(str(t) for t in tokens) + "]"


def _extends(prompt: list[int], history: list[int]) -> bool:
    return prompt[: len(history)] == history


@st.composite
def _next_prompt(
    draw: st.DrawFn,
    history: list[int],
    kinds: tuple[DriftKind, ...],
    max_env: int,
    force: bool = False,
) -> tuple[list[int], DriftKind | None]:
    delta = draw(st.lists(TOKENS, max_size=max_env))
    if not kinds or (not force and not draw(st.booleans())):
        return history + delta, None
    kind = draw(st.sampled_from(kinds))
    body = list(history)
    if kind == "retokenized":
        i = draw(st.integers(0, len(body) - 1))
        body[i] = body[i] + 1
    elif kind == "stripped":
        body = body[: draw(st.integers(0, len(body) - 1))]
    else:
        i = draw(st.integers(0, len(body) - 1))
        body.insert(i, draw(TOKENS))
    return body + delta, kind


def _non_model_item(kind: str, turn: int) -> dict[str, Any]:
    if kind == "function_call_output":
        return {"type": "function_call_output", "call_id": f"call_{turn}", "output": '{"ok":1}'}
    return {"type": "reasoning", "id": f"rs_{turn}", "summary": [{"type": "summary_text"}]}


def _model_item(
    kind: str, turn: int, prompt: list[int], gen: list[int], lps: list[float]
) -> dict[str, Any]:
    head: dict[str, Any]
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


@attrs.frozen(kw_only=True)
class _Sizes:
    max_prompt: int
    max_generation: int
    max_env: int
    logprobs: st.SearchStrategy[float]


@st.composite
def _turn(
    draw: st.DrawFn,
    turn: int,
    history: list[int],
    kinds: tuple[DriftKind, ...],
    force: bool,
    sizes: _Sizes,
) -> tuple[list[int], DriftKind | None, list[int], list[float], list[dict[str, Any]]]:
    """One model turn: its prompt (and how it drifts), generation, logprobs and items."""
    kind: DriftKind | None = None
    if turn == 0:
        prompt = draw(st.lists(TOKENS, min_size=1, max_size=max(1, sizes.max_prompt)))
    else:
        prompt, kind = draw(_next_prompt(history, kinds, sizes.max_env, force))
        if _extends(prompt, history):
            kind = None
        elif kind is None:
            kind = "rerendered"
    generation = draw(st.lists(TOKENS, min_size=1, max_size=max(1, sizes.max_generation)))
    lps = draw(st.lists(sizes.logprobs, min_size=len(generation), max_size=len(generation)))
    items = st.lists(st.sampled_from(["function_call_output", "reasoning"]), max_size=2)
    output = [_non_model_item(item_kind, turn) for item_kind in draw(items)]
    model_kind = draw(st.sampled_from(["function_call", "message"]))
    output.append(_model_item(model_kind, turn, prompt, generation, lps))
    return prompt, kind, generation, lps, output


@st.composite
def _episodes(
    draw: st.DrawFn,
    *,
    kinds: tuple[DriftKind, ...],
    force_drift: bool,
    min_turns: int,
    max_turns: int,
    sizes: _Sizes,
    rewards: st.SearchStrategy[float],
) -> Episode:
    n_turns = draw(st.integers(min_turns, max_turns))
    # with force_drift, turn ``first`` drifts and none before it: shrinking moves the drift
    # to turn 1 of a two-turn episode, as the docs draw it
    first = draw(st.integers(1, n_turns - 1)) if force_drift else 1
    prompts: list[list[int]] = []
    generations: list[list[int]] = []
    lps_per_turn: list[list[float]] = []
    drifts: list[tuple[int, DriftKind]] = []
    output: list[dict[str, Any]] = []
    for turn in range(n_turns):
        history = prompts[-1] + generations[-1] if turn else []
        allowed = kinds if turn >= first else ()
        prompt, kind, generation, lps, items = draw(
            _turn(turn, history, allowed, force_drift and turn == first, sizes)
        )
        if kind is not None:
            drifts.append((turn, kind))
        output += items
        prompts.append(prompt)
        generations.append(generation)
        lps_per_turn.append(lps)
    return _assemble(output, prompts, generations, lps_per_turn, drifts, draw(rewards))


def _assemble(
    output: list[dict[str, Any]],
    prompts: list[list[int]],
    generations: list[list[int]],
    logprobs: list[list[float]],
    drifts: list[tuple[int, DriftKind]],
    reward: float,
    first_input: str = "hi",
) -> Episode:
    """The ``Episode`` of a drawn ``/run`` output and its per-turn facts."""
    return Episode(
        response={
            "responses_create_params": {"input": first_input},
            "response": {"output": output},
            "reward": reward,
        },
        prompts=tuple(map(tuple, prompts)),
        generations=tuple(map(tuple, generations)),
        logprobs=tuple(map(tuple, logprobs)),
        drift_turns=frozenset(turn for turn, _ in drifts),
        drift_kinds=tuple(drifts),
        reward=reward,
    )


def _sizes(
    max_prompt: int, max_generation: int, max_env: int, logprobs: st.SearchStrategy[float]
) -> _Sizes:
    return _Sizes(
        max_prompt=max_prompt, max_generation=max_generation, max_env=max_env, logprobs=logprobs
    )


def _bounds(min_turns: int, max_turns: int, drift_kinds: tuple[DriftKind, ...]) -> None:
    if not 1 <= min_turns <= max_turns:
        raise ValueError(f"need 1 <= min_turns <= max_turns, got {min_turns} and {max_turns}")
    if not drift_kinds or not set(drift_kinds) <= set(DRIFT_KINDS):
        raise ValueError(f"drift_kinds must be some of {DRIFT_KINDS}, got {drift_kinds}")


def episodes(
    *,
    drift: bool = False,
    min_turns: int = 1,
    max_turns: int = 6,
    max_prompt: int = 12,
    max_generation: int = 8,
    max_env: int = 8,
    logprobs: st.SearchStrategy[float] = LOGPROBS,
    rewards: st.SearchStrategy[float] = JSON_REWARDS,
    drift_kinds: tuple[DriftKind, ...] = DRIFT_KINDS,
) -> st.SearchStrategy[Episode]:
    """``/run`` results with ``min_turns``..``max_turns`` model turns, as ``Episode``.

    Args:
        drift: let later prompts drift from the history (each with probability about
            one half); without it every prompt extends the history exactly.
        min_turns: fewest model turns (at least 1).
        max_turns: most model turns.
        max_prompt: longest first prompt (at least one token).
        max_generation: longest generation per turn (at least one token).
        max_env: most environment tokens between two turns (tool output, template glue).
        logprobs: strategy for each generated token's logprob.
        rewards: strategy for the episode's ``reward`` (floats and JSON integers).
        drift_kinds: the ways a prompt may drift (``DRIFT_KINDS``), when ``drift``.
    """
    _bounds(min_turns, max_turns, drift_kinds)
    return _episodes(
        kinds=tuple(drift_kinds) if drift else (),
        force_drift=False,
        min_turns=min_turns,
        max_turns=max_turns,
        sizes=_sizes(max_prompt, max_generation, max_env, logprobs),
        rewards=rewards,
    )


def drifted_episodes(
    *,
    min_turns: int = 2,
    max_turns: int = 6,
    max_prompt: int = 12,
    max_generation: int = 8,
    max_env: int = 8,
    logprobs: st.SearchStrategy[float] = LOGPROBS,
    rewards: st.SearchStrategy[float] = JSON_REWARDS,
    drift_kinds: tuple[DriftKind, ...] = DRIFT_KINDS,
) -> st.SearchStrategy[Episode]:
    """Episodes in which at least one turn drifts, with no drift before the first one
    (so counterexamples shrink to a two-turn episode that drifts at turn 1);
    ``Episode.drift_kinds`` says where and how. Arguments as for ``episodes``."""
    _bounds(max(2, min_turns), max(2, max_turns), drift_kinds)
    return _episodes(
        kinds=tuple(drift_kinds),
        force_drift=True,
        min_turns=max(2, min_turns),
        max_turns=max(2, max_turns),
        sizes=_sizes(max_prompt, max_generation, max_env, logprobs),
        rewards=rewards,
    ).filter(lambda episode: bool(episode.drift_turns))
