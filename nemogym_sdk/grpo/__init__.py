"""Group-relative advantages for GRPO, failure-aware (numpy only; losses live in adapters).

GRPO plays every dataset row ``num_generations`` times and scores each rollout against
the other rollouts of the same row. Here a *group* is the set of rollouts that share
``Batch.row_ids`` (the stable row id that ``AgentClient`` stamps on every rollout, and
``parse_agent_response(..., row_id=...)`` on a hand-parsed one), never rows that merely
share prompt text: two dataset rows with the same prompt are two groups. Group numbers
(``Advantages.group_index``) follow the order in which row ids first appear in the batch.

Episodes, not rows. A ``Batch`` row may be one of several samples of one episode (a
rollout and its ``forks`` share ``Batch.episode_index``). Statistics run over
*episodes*: an episode's status and reward are read from its first row, and every row
of the episode then gets the episode's advantage (times 0 when that row itself is not
``OK``). A fork therefore never counts twice in a baseline.

The rules, for the ``OK`` episodes ``r_1 .. r_n`` of one group, ``S = r_1 + .. + r_n``:

1. Failures leave the group. Episodes whose status is not ``OK`` are left out of the
   group's mean and standard deviation and get advantage 0. Their reward (the seed's
   placeholder, usually 0.0) is never read, so a failure never moves another rollout's
   advantage: an infrastructure error is not a reward of 0.
2. Degenerate groups. A group with fewer than two ``OK`` episodes has no baseline; all
   its advantages are 0 and it is counted in ``AdvantageStats.degenerate_groups``.
3. Baseline. ``mean = S / n``. With ``leave_one_out=True`` (RLOO, NeMo RL's
   ``use_leave_one_out_baseline``) episode ``i`` is compared with the mean of the
   *other* episodes, ``(S - r_i) / (n - 1)``; this equals ``n / (n - 1)`` times the
   plain centered reward.
4. Scaling, after centering (TRL's ``scale_rewards``): ``group`` divides by the group's
   standard deviation, ``batch`` by the standard deviation of every ``OK`` episode
   reward of the batch (degenerate groups included), ``none`` does not divide (Dr.
   GRPO). Standard deviations are *sample* deviations (``ddof=1``), as in TRL and NeMo
   RL, and ``epsilon`` (default 1e-6; TRL's is 1e-4) is added to the denominator:
   ``(r_i - baseline_i) / (std + eps)``. With ``leave_one_out`` the scale is still the
   std of all ``n`` rewards.
5. Zero spread. A group with at least two ``OK`` episodes whose rewards are all equal
   teaches nothing: its advantages are exactly 0 (not merely rounding noise) and it is
   counted in ``AdvantageStats.zero_spread_groups``.
6. Multiple rewards. With ``reward_weights`` the per-term ``Batch.reward_components``
   are used instead of ``Batch.rewards``:

   - ``aggregation="sum"`` (TRL's ``sum_then_normalize``): ``r = sum_k w_k * c_k``, then
     rules 1-5 on ``r``.
   - ``aggregation="gdpo"`` (GDPO, NVIDIA's group reward-decoupled normalization, TRL's
     ``normalize_then_sum``): rules 1-5 on each component separately, then the weighted
     sum ``x = sum_k w_k * A_k``; with ``gdpo_batch_norm`` that sum is standardized over
     the ``OK`` episodes of the non-degenerate groups, ``(x - mean) / (std + eps)``
     (``ddof=1``). Every group's component advantages sum to 0, so ``mean`` is 0 up to
     rounding; rows of degenerate groups stay 0. A group is "zero spread" when every
     weighted component is constant over its ``OK`` episodes; its advantages are 0.
     Without ``reward_weights``, ``gdpo`` weighs every component of the batch by 1.0.

     Where this differs from TRL 1.16's ``normalize_then_sum``, exactly: a group with a
     single ``OK`` episode. TRL's per-component normalisation gives that episode NaN
     (the ``ddof=1`` std of one value), ``nansum`` turns the NaNs into a sum of 0, and
     the episode then takes part in the batch mean and std as a 0 and gets advantage
     ``(0 - mean) / (std + eps)``. Here it stays 0 and takes no part in the batch
     statistics. On batches where no group has exactly one ``OK`` episode the two agree
     (with ``epsilon=1e-4`` and ``scale="group"``, the only scale TRL applies there).

   The scalar reward reported in ``Advantages.rewards`` and the reward statistics is
   ``sum_k w_k * c_k`` in both modes.

Several processes. Under ``torchrun`` each rank passes its shard of *whole groups*.
Rules 1-5 per group need nothing else; the batch statistics (``scale="batch"``, GDPO's
batch normalisation) take ``gather=nemogym_sdk.adapters.torch.all_gather_array`` and
then equal, bit for bit, those of one process on the concatenated batch. Asking for a
batch statistic while a process group is up and no ``gather`` is given is a
``ConfigError``, never a silent per-rank statistic (``nemogym_sdk.grpo.gather``).

The result does not depend on the order of the rollouts: sums run over each group's
rewards sorted by value, so advantages are bit-for-bit reproducible whatever order the
rollouts completed in, and adding, removing or changing failed rollouts leaves every
other advantage bit-for-bit unchanged.

Errors: a bad argument (unknown ``scale`` or ``aggregation``, a weight naming a
component no row has, a row without a row id) is a ``ConfigError``; bad data (a
non-finite reward on an ``OK`` row, an ``OK`` row lacking a weighted component, samples of
one episode with different row ids) is a ``DataError``.
Neither function mutates its inputs.

Example, one group of four rollouts of which one failed::

    rewards [1, 0, 1, x]   ok [T, T, T, F]
    OK rewards [1, 0, 1]: mean 2/3, std(ddof=1) 0.577
    advantages [0.577, -1.155, 0.577, 0]   (x never matters)

The loss configuration (``PolicyLoss``, ``LossType``, ``ImportanceSampling``) lives here
too, torch-free; ``nemogym_sdk.adapters.torch`` computes the losses.
"""

from __future__ import annotations

from nemogym_sdk.grpo.advantages import compute_advantages
from nemogym_sdk.grpo.gather import Gather
from nemogym_sdk.grpo.loss import ImportanceSampling, LossType, PolicyLoss
from nemogym_sdk.grpo.normalize import group_advantages
from nemogym_sdk.grpo.results import Advantages, AdvantageStats, Aggregation, Scaling

__all__ = [
    "AdvantageStats",
    "Advantages",
    "Aggregation",
    "Gather",
    "ImportanceSampling",
    "LossType",
    "PolicyLoss",
    "Scaling",
    "compute_advantages",
    "group_advantages",
]
