"""Rules and data of the ``target_chars`` toy environment, in plain Python.

No third-party imports: the resources server (``app.py``, NeMo Gym's Python 3.13 venv)
imports this file as a sibling module, and the SDK's tests (Python 3.11) load it by path to
compute expected rewards independently of the server.

The game. An episode has ``num_rounds`` rounds. Each round the environment shows a short
observation with a fresh four-letter word (drawn deterministically from the row's ``seed``);
the model replies; the reply scores the share of its characters that are in the row's
``target_chars``::

    round_reward("hello", "abcdefghijklmnopqrstuvwxyz") == 1.0
    round_reward("Hi!", "abcdefghijklmnopqrstuvwxyz") == 1 / 3

Each step returns ``round_reward / num_rounds``, so the episode total (``gymnasium_agent``
sums step rewards) is the mean round reward, in [0, 1]. Copying the shown word scores 1.

An optional row field ``latency`` makes the environment slow, as tools and sandboxes are:
before answering each step it waits ``min(cap_s, scale_s * Pareto(alpha))`` seconds, and with
probability ``stall_p`` it stalls for ``stall_s`` instead (heavy-tailed episode lengths, for
the asynchronous trainer's tests and benchmark); with probability ``error_p`` an episode's
tool is broken: every step of it answers HTTP 500 after its delay, so its ``/run`` fails::

    {"latency": {"scale_s": 0.05, "alpha": 1.2, "cap_s": 4.0, "stall_p": 0.01, "stall_s": 60}}

Regenerate the shipped data with ``python rules.py`` (writes ``data/example.jsonl`` and
``data/train.jsonl`` next to this file).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import random
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

NAME = "target_chars"
"""Environment name: the resources server instance and its directory."""
AGENT_NAME = "target_chars_agent"
"""The ``gymnasium_agent`` instance that plays this environment (rows' ``agent_ref.name``)."""
LOWERCASE = "abcdefghijklmnopqrstuvwxyz"
"""The default target set. A random byte-level policy emits these ~11% of the time."""
DEFAULT_NUM_ROUNDS = 3
"""Rounds per episode when a row sets none (the agent's ``max_steps`` must be at least this)."""
WORD_LENGTH = 4
"""Letters of the word shown each round."""
MAX_OUTPUT_TOKENS = 12
"""``responses_create_params.max_output_tokens`` of the generated rows."""
EXAMPLE_SEEDS = range(1000, 1005)
"""Seeds of ``data/example.jsonl`` (5 rows, disjoint from the train seeds)."""
TRAIN_SEEDS = range(64)
"""Seeds of ``data/train.jsonl`` (64 rows)."""


def round_reward(text: str, target_chars: str) -> float:
    """Share of the characters of ``text`` that are in ``target_chars``; 0.0 for ``""``.

    Characters are Unicode code points: ``"é"`` or ``"\\ufffd"`` count as one character that
    is (normally) not a target.
    """
    if not text:
        return 0.0
    allowed = set(target_chars)
    return sum(char in allowed for char in text) / len(text)


def describe_target(target_chars: str) -> str:
    """How the prompts name the target set: ``lowercase letters`` for the default."""
    if set(target_chars) == set(LOWERCASE):
        return "lowercase letters"
    return f"the characters {target_chars}"


def system_prompt(target_chars: str) -> str:
    """The rule, as the row's system message."""
    return f"Reply with {describe_target(target_chars)} only."


def user_prompt(num_rounds: int) -> str:
    """The row's user message."""
    return f"Let's play {num_rounds} rounds."


def round_word(seed: int, round_number: int, target_chars: str = LOWERCASE) -> str:
    """The word shown in round ``round_number`` (1-based) of the row with ``seed``.

    Drawn from ``target_chars`` with SHA-256, so it is the same in every Python version.
    """
    alphabet = "".join(dict.fromkeys(target_chars))
    digest = hashlib.sha256(f"{NAME}:{seed}:{round_number}".encode()).digest()
    return "".join(alphabet[byte % len(alphabet)] for byte in digest[:WORD_LENGTH])


def observation(
    seed: int, round_number: int, num_rounds: int, target_chars: str = LOWERCASE
) -> str:
    """The observation opening round ``round_number``, e.g.
    ``Round 2 of 3. Word: qmtw. Reply in lowercase letters.``"""
    word = round_word(seed, round_number, target_chars)
    return (
        f"Round {round_number} of {num_rounds}. Word: {word}. "
        f"Reply in {describe_target(target_chars)}."
    )


@dataclasses.dataclass(frozen=True)
class Latency:
    """How long the environment takes to answer a step (the row's ``latency`` field)."""

    scale_s: float = 0.05
    """The shortest delay; delays are ``scale_s`` times a Pareto draw."""
    alpha: float = 1.2
    """The Pareto shape: smaller is heavier-tailed (below 2, the variance is infinite)."""
    cap_s: float = 4.0
    """The longest ordinary delay."""
    stall_p: float = 0.0
    """Probability that a step stalls instead."""
    stall_s: float = 60.0
    """How long a stall lasts."""
    error_p: float = 0.0
    """Probability that an episode's tool is broken: each of its steps fails (HTTP 500)."""

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Latency | None:
        """The row's latency, or None when it has none; ``ValueError`` for a bad one."""
        raw = row.get("latency")
        if raw is None:
            return None
        if not isinstance(raw, Mapping):
            raise ValueError(f"latency must be an object, got {raw!r}")
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(raw) - names)
        if unknown:
            raise ValueError(f"latency: unknown field(s) {', '.join(unknown)}")
        values = dict(raw)
        for name, value in values.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise ValueError(f"latency.{name} must be a number >= 0, got {value!r}")
        latency = cls(**{k: float(v) for k, v in values.items()})
        if latency.alpha <= 0 or latency.stall_p > 1 or latency.error_p > 1:
            raise ValueError("latency needs alpha > 0, stall_p <= 1 and error_p <= 1")
        return latency

    def delay(self, rng: random.Random) -> float:
        """Seconds to wait before answering one step."""
        if self.stall_p and rng.random() < self.stall_p:
            return self.stall_s
        return min(self.cap_s, self.scale_s * rng.paretovariate(self.alpha))

    def breaks(self, rng: random.Random) -> bool:
        """Whether a new episode's tool is broken (``error_p``)."""
        return bool(self.error_p) and rng.random() < self.error_p


@dataclasses.dataclass(frozen=True)
class Task:
    """The task fields of one row."""

    seed: int
    """Makes the row distinct: it picks the word of every round."""
    target_chars: str = LOWERCASE
    """Characters that score."""
    num_rounds: int = DEFAULT_NUM_ROUNDS
    """Rounds in the episode."""
    latency: Latency | None = None
    """How slow each step is (None: it answers at once)."""

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Task:
        """The task of a row (its top-level fields); ``ValueError`` naming a bad field."""
        seed = row.get("seed")
        target_chars = row.get("target_chars", LOWERCASE)
        num_rounds = row.get("num_rounds", DEFAULT_NUM_ROUNDS)
        if not isinstance(seed, int) or isinstance(seed, bool):
            raise ValueError(f"seed must be an integer, got {seed!r}")
        if not isinstance(target_chars, str) or not target_chars:
            raise ValueError(f"target_chars must be a non-empty string, got {target_chars!r}")
        if not isinstance(num_rounds, int) or isinstance(num_rounds, bool) or num_rounds < 1:
            raise ValueError(f"num_rounds must be an integer >= 1, got {num_rounds!r}")
        return cls(
            seed=seed,
            target_chars=target_chars,
            num_rounds=num_rounds,
            latency=Latency.from_row(row),
        )

    def observation(self, round_number: int) -> str:
        """The observation opening round ``round_number`` (1-based)."""
        return observation(self.seed, round_number, self.num_rounds, self.target_chars)


@dataclasses.dataclass(frozen=True)
class StepResult:
    """What one ``/step`` returns (the Gymnasium tuple minus ``truncated``)."""

    observation: str | None
    """The next round's observation; ``None`` after the last round."""
    reward: float
    """``round_reward / num_rounds``."""
    terminated: bool
    """True after the last round."""
    info: dict[str, Any]
    """``round``, ``round_reward``; after the last round also ``round_rewards``."""


# --8<-- [start:game-state]  (docs/writing-an-environment.md shows this class)
@dataclasses.dataclass
class GameState:
    """One running episode: the task and the round rewards so far (per-session state)."""

    task: Task
    round_rewards: list[float] = dataclasses.field(default_factory=list)
    broken: bool = False
    """The episode's tool fails every step (``Latency.error_p``)."""

    @property
    def round_number(self) -> int:
        """The round the next reply answers (1-based)."""
        return len(self.round_rewards) + 1

    def step(self, reply: str) -> StepResult:
        """Score ``reply`` for the current round and move to the next one."""
        if self.round_number > self.task.num_rounds:
            raise ValueError(f"the episode ended after {self.task.num_rounds} rounds")
        played = self.round_number
        score = round_reward(reply, self.task.target_chars)
        self.round_rewards.append(score)
        info: dict[str, Any] = {"round": played, "round_reward": score}
        terminated = played == self.task.num_rounds
        if terminated:
            info["round_rewards"] = list(self.round_rewards)
        return StepResult(
            observation=None if terminated else self.task.observation(played + 1),
            reward=score / self.task.num_rounds,
            terminated=terminated,
            info=info,
        )
        # --8<-- [end:game-state]


# ----------------------------------------------------------------------------------- data


def make_row(
    seed: int, *, target_chars: str = LOWERCASE, num_rounds: int = DEFAULT_NUM_ROUNDS
) -> dict[str, Any]:
    """One NeMo Gym row: the prompt, the task fields and the agent to play it."""
    return {
        "responses_create_params": {
            "input": [
                {"role": "system", "content": system_prompt(target_chars)},
                {"role": "user", "content": user_prompt(num_rounds)},
            ],
            "max_output_tokens": MAX_OUTPUT_TOKENS,
        },
        "seed": seed,
        "target_chars": target_chars,
        "num_rounds": num_rounds,
        "agent_ref": {"type": "responses_api_agents", "name": AGENT_NAME},
    }


def example_rows() -> list[dict[str, Any]]:
    """The rows of ``data/example.jsonl``."""
    return [make_row(seed) for seed in EXAMPLE_SEEDS]


def train_rows() -> list[dict[str, Any]]:
    """The rows of ``data/train.jsonl``."""
    return [make_row(seed) for seed in TRAIN_SEEDS]


def jsonl(rows: list[dict[str, Any]]) -> str:
    """Rows as JSONL text, one compact line each (the shipped files' exact bytes)."""
    return "".join(json.dumps(row, separators=(",", ":")) + "\n" for row in rows)


def datasets() -> dict[str, str]:
    """``{file name under data/: its text}`` for every shipped dataset."""
    return {"example.jsonl": jsonl(example_rows()), "train.jsonl": jsonl(train_rows())}


def write_datasets(data_dir: Path) -> None:
    """Write the shipped datasets into ``data_dir``."""
    data_dir.mkdir(parents=True, exist_ok=True)
    for name, text in datasets().items():
        (data_dir / name).write_text(text, encoding="utf-8")


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent / "data"
    write_datasets(target)
    print(f"wrote {', '.join(datasets())} to {target}")
