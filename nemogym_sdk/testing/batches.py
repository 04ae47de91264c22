"""Hypothesis strategies for trainer-side records: rollouts to collate, reward groups.

``rollouts()`` draws ``Rollout`` records of any status and length (collation
properties); ``reward_groups()`` and ``grouped_rollouts()`` draw interleaved GRPO groups
with failures among them (advantage properties). When a record gains a field, give it a
strategy here.
"""

from __future__ import annotations

import attrs
from hypothesis import strategies as st

from nemogym_sdk import Rollout, RolloutStatus
from nemogym_sdk.testing.episodes import LOGPROBS, REWARDS, TOKENS

__all__ = [
    "BINARY_OR_GRID",
    "BINARY_OR_REWARDS",
    "FAILED_STATUSES",
    "GRID_REWARDS",
    "RewardGroups",
    "grouped_rollouts",
    "reward_groups",
    "rollouts",
    "scored_rollout",
]


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
