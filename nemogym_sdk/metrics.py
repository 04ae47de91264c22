"""What a training step's rollouts were: one set of step metrics for every trainer.

``RolloutStats.of(batch, advantages)`` counts, for one rank's batch, everything a trainer
logs about its rollouts: episodes by status, rewards and turns of the ``OK`` ones, policy
and environment tokens, truncations, and the groups that teach nothing (degenerate or zero
spread, as ``compute_advantages`` decided). Every field is a sum, so the stats of several
ranks merge exactly (``RolloutStats.merge``; groups never span ranks, because ranks play
whole groups). ``as_metrics`` names them for a logger. The learner's side (loss, clipping,
importance weights, sampler-learner mismatch) is ``adapters.torch.StepMetrics``, already
reduced over ranks by ``train_step``; a step's line is the two together.

The reference trainer (``nemogym-train``), the axolotl data producer, the TRL rollout
function and ``examples/torch_grpo.py`` all log these, under these names.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

import attrs
import numpy as np

from nemogym_sdk.grpo import Advantages, compute_advantages
from nemogym_sdk.records import Batch, RolloutStatus

__all__ = ["RolloutStats", "scalars"]


def _counts(value: Mapping[str, int]) -> dict[str, int]:
    return {str(k): int(v) for k, v in value.items() if v}


@attrs.frozen(kw_only=True)
class RolloutStats:
    """Sums over one step's rollouts (one rank's, or several merged)."""

    episodes: int
    """Episodes played (rollouts handed in; a rollout's forks are one episode)."""
    samples: int
    """Batch rows (samples, forks included)."""
    statuses: Mapping[str, int] = attrs.field(converter=_counts)
    """Episodes per ``RolloutStatus`` value (statuses with none are left out)."""
    ok_reward_sum: float
    """Sum of the rewards of ``OK`` episodes."""
    ok_reward_square_sum: float
    """Sum of their squares (for the standard deviation)."""
    ok_turns_sum: int
    """Sum of the model turns of ``OK`` episodes' samples."""
    ok_samples: int
    """``OK`` samples (the rows ``ok_turns_sum`` counts)."""
    policy_tokens: int
    """Policy tokens of ``OK`` samples: what the loss may train on."""
    env_tokens: int
    """Environment tokens of ``OK`` samples (tool output, template glue): context only."""
    truncated: int
    """Samples cut to ``max_completion_length``."""
    groups: int
    """Groups (rows of the dataset, each played ``num_generations`` times)."""
    degenerate_groups: int
    """Groups with fewer than two ``OK`` episodes: no baseline, advantages 0."""
    zero_spread_groups: int
    """Groups whose ``OK`` rewards are all equal: advantages 0."""
    partial_groups: int = 0
    """Groups with at least one episode that is not ``OK`` (trained with fewer than all
    their episodes)."""
    staleness: Mapping[str, int] = attrs.field(factory=dict, converter=_counts)
    """Policy tokens of ``OK`` samples per staleness (``str(versions behind)``: how many
    adapter versions the learner had moved on from the one that generated the token);
    counted when ``of`` is given the learner's version and the tokens report theirs."""
    unversioned_tokens: int = 0
    """Policy tokens of ``OK`` samples whose sampler reported no version (counted with a
    learner version only)."""

    @classmethod
    def of(
        cls,
        batch: Batch,
        advantages: Advantages | None = None,
        *,
        learner_version: int | None = None,
    ) -> RolloutStats:
        """The stats of one batch; ``advantages`` (``compute_advantages(batch)``) says
        which groups teach nothing, and is computed with the defaults when not given;
        ``learner_version`` (the version of the weights the step starts from) adds the
        staleness histogram (``Batch.staleness``)."""
        if advantages is None:
            advantages = compute_advantages(batch)
        _, first_E = np.unique(batch.episode_index, return_index=True)
        ok_B = np.asarray(batch.ok, dtype=np.bool_)
        ok_E = ok_B[first_E]
        rewards_E = np.asarray(batch.rewards, dtype=np.float64)[first_E][ok_E]
        completion_BT = np.asarray(batch.completion_mask, dtype=np.int64) * ok_B[:, None]
        policy_BT = completion_BT * np.asarray(batch.env_mask, dtype=np.int64)
        statuses = Counter(str(s) for s in np.asarray(batch.statuses)[first_E].tolist())
        group_stats = advantages.stats
        staleness: Counter[str] = Counter()
        unversioned = 0
        if learner_version is not None:
            behind_BT = batch.staleness(learner_version)
            values, counts = np.unique(behind_BT[behind_BT >= 0], return_counts=True)
            staleness.update({str(int(v)): int(c) for v, c in zip(values, counts, strict=True)})
            unversioned = int(policy_BT.sum()) - int(counts.sum())
        return cls(
            episodes=int(first_E.shape[0]),
            samples=len(batch),
            statuses=statuses,
            ok_reward_sum=float(rewards_E.sum()),
            ok_reward_square_sum=float((rewards_E * rewards_E).sum()),
            ok_turns_sum=int(np.asarray(batch.num_turns)[ok_B].sum()),
            ok_samples=int(ok_B.sum()),
            policy_tokens=int(policy_BT.sum()),
            env_tokens=int(completion_BT.sum() - policy_BT.sum()),
            truncated=int(np.asarray(batch.truncated).sum()),
            groups=int(group_stats.num_groups),
            degenerate_groups=int(group_stats.degenerate_groups),
            zero_spread_groups=int(group_stats.zero_spread_groups),
            partial_groups=int(group_stats.partial_groups),
            staleness=staleness,
            unversioned_tokens=unversioned,
        )

    @classmethod
    def merge(cls, parts: Iterable[RolloutStats]) -> RolloutStats:
        """The stats of several ranks' batches together (every field adds up)."""
        parts = list(parts)
        if not parts:
            raise ValueError("merge needs at least one RolloutStats")
        sums: dict[str, Any] = {}
        for field in attrs.fields(cls):
            values = [getattr(part, field.name) for part in parts]
            if field.name in ("statuses", "staleness"):
                sums[field.name] = sum((Counter(v) for v in values), Counter())
            else:
                sums[field.name] = sum(values)
        return cls(**sums)

    @property
    def ok(self) -> int:
        """``OK`` episodes."""
        return self.statuses.get(RolloutStatus.OK.value, 0)

    @property
    def reward_mean(self) -> float:
        """Mean reward of ``OK`` episodes (NaN without any)."""
        return self.ok_reward_sum / self.ok if self.ok else math.nan

    @property
    def reward_std(self) -> float:
        """Population standard deviation of the same rewards (NaN without any)."""
        if not self.ok:
            return math.nan
        mean = self.reward_mean
        return math.sqrt(max(0.0, self.ok_reward_square_sum / self.ok - mean * mean))

    def as_metrics(self) -> dict[str, Any]:
        """The step metrics, by the names every trainer logs them under.

        ``rollouts``, ``ok``, ``ok_fraction``, ``failures`` (episodes per failed status, a
        dict), ``reward_mean``, ``reward_std``, ``turns_mean``, ``samples``,
        ``policy_tokens``, ``env_tokens``, ``truncated``, ``groups``,
        ``degenerate_groups``, ``zero_spread_groups``, ``partial_groups``, ``staleness``
        (policy tokens per versions behind, a dict), ``staleness_mean``, ``staleness_max``
        (0 without versioned tokens), ``unversioned_tokens``.
        """
        behind = {int(k): v for k, v in self.staleness.items()}
        versioned = sum(behind.values())
        return {
            "rollouts": self.episodes,
            "ok": self.ok,
            "ok_fraction": self.ok / self.episodes if self.episodes else math.nan,
            "failures": {
                status: count
                for status, count in self.statuses.items()
                if status != RolloutStatus.OK.value
            },
            "reward_mean": self.reward_mean,
            "reward_std": self.reward_std,
            "turns_mean": self.ok_turns_sum / self.ok_samples if self.ok_samples else 0.0,
            "samples": self.samples,
            "policy_tokens": self.policy_tokens,
            "env_tokens": self.env_tokens,
            "truncated": self.truncated,
            "groups": self.groups,
            "degenerate_groups": self.degenerate_groups,
            "zero_spread_groups": self.zero_spread_groups,
            "partial_groups": self.partial_groups,
            "staleness": dict(sorted(self.staleness.items(), key=lambda kv: int(kv[0]))),
            "staleness_mean": (
                sum(k * v for k, v in behind.items()) / versioned if versioned else 0.0
            ),
            "staleness_max": max(behind, default=0),
            "unversioned_tokens": self.unversioned_tokens,
        }


def scalars(metrics: Mapping[str, Any], prefix: str = "") -> dict[str, float]:
    """The numbers of a step's metrics, flat, as a tracker logs them: a dict's items under
    ``name/key`` (``failures`` -> ``failures/TIMEOUT``, ``staleness`` -> ``staleness/1``),
    every name after ``prefix``; strings and None are left out, NaN is kept.

    >>> scalars({"reward_mean": 0.5, "failures": {"TIMEOUT": 2}, "device": "cpu"}, "g/")
    {'g/reward_mean': 0.5, 'g/failures/TIMEOUT': 2.0}
    """
    flat: dict[str, float] = {}
    for name, value in metrics.items():
        if isinstance(value, Mapping):
            flat.update(scalars(value, f"{prefix}{name}/"))
        elif isinstance(value, int | float):  # bool too (0 or 1)
            flat[f"{prefix}{name}"] = float(value)
    return flat
