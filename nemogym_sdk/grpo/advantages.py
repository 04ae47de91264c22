"""``compute_advantages``: per-row GRPO advantages of a collated ``Batch`` (rules 1-6)."""

from __future__ import annotations

import logging
from collections.abc import Mapping

import attrs
import numpy as np

from nemogym_sdk.errors import ConfigError, DataError, NemoGymError
from nemogym_sdk.grpo.gather import Gather, agree, other_rank_failed, required
from nemogym_sdk.grpo.gdpo import (
    check_present,
    component_rewards,
    gdpo,
    present,
    requested_weights,
)
from nemogym_sdk.grpo.normalize import DEFAULT_EPSILON, check_epsilon, choice, dense, normalize
from nemogym_sdk.grpo.results import (
    Advantages,
    AdvantageStats,
    Aggregation,
    BoolArray,
    FloatArray,
    IntArray,
    Scaling,
)
from nemogym_sdk.records import Batch

__all__ = ["compute_advantages"]

logger = logging.getLogger(__name__)


@attrs.frozen(kw_only=True)
class _Episodes:
    """Which rows form which episode and group (an episode's first row carries its status
    and reward)."""

    row_ids: tuple[str, ...]
    """``[B]`` row id of each row."""
    first_row: IntArray
    """``[E]`` first row of each episode."""
    episode_of_row: IntArray
    """``[B]`` episode of each row."""
    group_of_row: IntArray
    """``[B]`` dense group of each row."""
    num_groups: int
    """``G``."""
    ok_row: BoolArray
    """``[B]`` the row is OK."""

    @property
    def group_of_episode(self) -> IntArray:
        """``[E]`` dense group of each episode."""
        return self.group_of_row[self.first_row]

    @property
    def ok_episode(self) -> BoolArray:
        """``[E]`` the episode is OK (its first row is)."""
        return self.ok_row[self.first_row]


def _row_ids(batch: Batch) -> tuple[str, ...]:
    missing = [b for b, row_id in enumerate(batch.row_ids) if row_id is None]
    if missing:
        shown = ", ".join(map(str, missing[:8])) + (", ..." if len(missing) > 8 else "")
        raise ConfigError(
            f"{len(missing)} of {len(batch)} batch rows have no row_id (rows {shown}): groups "
            f"need the stable id of the dataset row each rollout played. AgentClient sets "
            f"it; a /run result parsed by hand gets it from parse_agent_response(response, "
            f"eos_token_id, row_id=..., repeat_index=...), a rollout built by hand from "
            f"Rollout(row_id=...) or attrs.evolve(rollout, row_id=...)"
        )
    return tuple(str(row_id) for row_id in batch.row_ids)


def _episodes(batch: Batch) -> _Episodes:
    row_ids = _row_ids(batch)
    _, first_E, episode_B = np.unique(batch.episode_index, return_index=True, return_inverse=True)
    first_E = first_E.astype(np.int64)
    episode_B = episode_B.reshape(-1).astype(np.int64)
    group_B, group_names = dense(row_ids)
    split_B = group_B != group_B[first_E][episode_B]
    if split_B.any():
        b = int(np.flatnonzero(split_B)[0])
        first = int(first_E[episode_B[b]])
        raise DataError(
            f"batch rows {first} and {b} are samples of one episode (episode_index "
            f"{int(batch.episode_index[b])}) but have different row ids {row_ids[first]!r} "
            f"and {row_ids[b]!r}; forks must keep their episode's row_id"
        )
    return _Episodes(
        row_ids=row_ids,
        first_row=first_E,
        episode_of_row=episode_B,
        group_of_row=group_B,
        num_groups=len(group_names),
        ok_row=np.asarray(batch.ok, dtype=np.bool_),
    )


def _episode_rewards(
    batch: Batch, episodes: _Episodes, weights: Mapping[str, float] | None
) -> tuple[FloatArray, dict[str, FloatArray]]:
    """``([E] scalar reward, {component: [E]})``, NaN where the episode is not OK."""
    ok_B, first_E, ok_E = episodes.ok_row, episodes.first_row, episodes.ok_episode
    if weights is None:
        reward_B = np.asarray(batch.rewards, dtype=np.float64)
        bad_B = ok_B & ~np.isfinite(reward_B)
        if bad_B.any():
            b = int(np.flatnonzero(bad_B)[0])
            raise DataError(
                f"batch row {b} (row_id {episodes.row_ids[b]!r}) is OK but its reward "
                f"{float(batch.rewards[b])} is not finite; an environment that cannot score "
                f"a rollout should fail it (a non-OK status) instead"
            )
        return np.where(ok_E, reward_B[first_E], np.nan), {}
    components = component_rewards(batch, weights, first_E, ok_B, episodes.row_ids)
    reward_E = np.zeros(first_E.shape[0], dtype=np.float64)
    for name, weight in weights.items():
        reward_E += weight * np.where(ok_E, components[name], 0.0)
    return np.where(ok_E, reward_E, np.nan), components


def _stats(
    batch: Batch, episodes: _Episodes, ok_count_G: IntArray, zero_spread_G: BoolArray
) -> AdvantageStats:
    episodes_G = np.bincount(episodes.group_of_episode, minlength=episodes.num_groups)
    return AdvantageStats(
        num_rows=len(batch),
        num_episodes=int(episodes.first_row.shape[0]),
        ok_episodes=int(np.count_nonzero(episodes.ok_episode)),
        num_groups=episodes.num_groups,
        degenerate_groups=int(np.count_nonzero(ok_count_G < 2)),
        zero_spread_groups=int(np.count_nonzero(zero_spread_G)),
        partial_groups=int(np.count_nonzero(ok_count_G < episodes_G)),
    )


def _batch_statistic(scale: Scaling, aggregation: Aggregation, gdpo_batch_norm: bool) -> str | None:
    """The statistic of these options that spans the batch (None: group statistics only)."""
    if scale is Scaling.BATCH:
        return "scale='batch'"
    if aggregation is Aggregation.GDPO and gdpo_batch_norm:
        return "aggregation='gdpo' with gdpo_batch_norm=True"
    return None


def compute_advantages(
    batch: Batch,
    *,
    scale: Scaling | str = Scaling.GROUP,
    leave_one_out: bool = False,
    reward_weights: Mapping[str, float] | None = None,
    aggregation: Aggregation | str = Aggregation.SUM,
    gdpo_batch_norm: bool = True,
    epsilon: float = DEFAULT_EPSILON,
    gather: Gather | None = None,
) -> Advantages:
    """Per-row GRPO advantages of a collated ``Batch`` (rules 1-6 of ``nemogym_sdk.grpo``).

    Args:
        batch: rollouts collated by ``nemogym_sdk.collate``; every row needs a
            ``row_id``. Not modified.
        scale: ``"group"``, ``"batch"`` or ``"none"`` (see ``Scaling``).
        leave_one_out: compare each episode with the mean of the other OK episodes.
        reward_weights: ``{component: weight}``; when given, rewards come from
            ``Batch.reward_components`` instead of ``Batch.rewards``.
        aggregation: ``"sum"`` (weighted sum, then normalize) or ``"gdpo"`` (normalize
            each component, then the weighted sum; see ``Aggregation``).
        gdpo_batch_norm: under ``gdpo``, standardize the weighted sum over the batch.
        epsilon: added to every standard deviation before dividing (TRL: 1e-4).
        gather: under ``torchrun``, where ``batch`` is this rank's shard of whole groups:
            the hook that makes the batch statistics (``scale="batch"``, GDPO's batch
            normalisation) span every rank's batch, e.g.
            ``nemogym_sdk.adapters.torch.all_gather_array`` (see ``Gather``). Every rank
            must call with the same options. Group statistics never need it.

    Raises:
        ConfigError: unknown ``scale`` or ``aggregation``, a bad ``epsilon`` or weight, a
            weight naming a component no row has, a row without ``row_id``; a batch
            statistic while ``torch.distributed`` is initialised and no ``gather`` is given;
            ``gdpo`` with ``gather`` and no ``reward_weights``.
        DataError: a non-finite reward on an OK row, an OK row lacking a weighted
            component, samples of one episode with different row ids, or (with
            ``gather``) any of these on another rank.
    """
    scaling = choice(Scaling, scale, "scale")
    mode = choice(Aggregation, aggregation, "aggregation")
    eps = check_epsilon(epsilon)
    hook = required(gather, _batch_statistic(scaling, mode, gdpo_batch_norm))
    weights = requested_weights(batch, reward_weights, mode, shared=hook is not None)
    problem: NemoGymError | None = None
    try:
        episodes = _episodes(batch)
        reward_E, components = _episode_rewards(batch, episodes, weights)
    except NemoGymError as exc:
        problem = exc
    # every rank learns of the others' problems before any statistic is gathered
    found, others_failed = agree(hook, problem is not None, present(batch, weights))
    check_present(batch, weights, found)
    if problem is not None:
        raise problem
    if others_failed:
        raise other_rank_failed()

    group_E, ok_E, G = episodes.group_of_episode, episodes.ok_episode, episodes.num_groups
    if weights is None or mode is Aggregation.SUM:
        normalized = normalize(reward_E, group_E, ok_E, G, scaling, leave_one_out, eps, hook)
        advantage_E = normalized.advantages
        ok_count_G, zero_spread_G = normalized.ok_count, normalized.zero_spread
    else:
        advantage_E, ok_count_G, zero_spread_G = gdpo(
            components,
            weights,
            group_E,
            ok_E,
            G,
            scaling,
            leave_one_out,
            eps,
            gdpo_batch_norm,
            hook,
        )

    ok_B, episode_B = episodes.ok_row, episodes.episode_of_row
    values_B = np.where(ok_B, advantage_E[episode_B], 0.0)
    rewards_B = np.where(ok_B & ok_E[episode_B], reward_E[episode_B], np.nan)
    stats = _stats(batch, episodes, ok_count_G, zero_spread_G)
    logger.debug(
        "advantages: %d rows, %d episodes (%d ok), %d groups (%d degenerate, %d zero spread)",
        *(stats.num_rows, stats.num_episodes, stats.ok_episodes, stats.num_groups),
        *(stats.degenerate_groups, stats.zero_spread_groups),
    )
    return Advantages(
        values=values_B, rewards=rewards_B, group_index=episodes.group_of_row, stats=stats
    )
