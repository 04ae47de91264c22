"""The two reward functions a NeMo Gym axolotl run lists under ``trl.reward_funcs`` (one of them).

- ``nemo_gym_env_reward`` (agent mode): the episode reward the agent reported, passed
  through from the ``env_reward`` column the data producer fills.
- ``nemo_gym_verify_reward`` (single-turn mode): scores the trainer's own completions on
  NeMo Gym resources servers (``/seed_session`` + ``/verify``, concurrent, through
  ``Verifier``). The plugin binds it to the deployment at start.

Failed rollouts are never scored as 0. axolotl 0.19's deferred scoring (its async GRPO
trainer, the one agent mode runs on) turns a ``None`` reward into NaN and then ``nansum``
collapses it to 0 *inside* the group mean, unlike TRL >= 1.6, which leaves such a row out
of the baseline. So a failed rollout is given the mean reward of the rollouts of its group
that did complete (``impute_failed``): the group's baseline is the completed rollouts' mean,
the failed row's advantage is exactly 0, and the data producer also zeroes its loss mask.
A group where nothing completed returns ``None`` for every rollout (advantage 0 everywhere).
Where the trainer is TRL's own (single-turn without a data producer), failures are ``None``:
TRL's unscorable path keeps them out of the statistics exactly.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from nemogym_sdk.adapters.axolotl.dataset import ROW, ROW_ID
from nemogym_sdk.errors import ConfigError, DataError
from nemogym_sdk.records import RolloutStatus
from nemogym_sdk.verify import Verifier

__all__ = [
    "ENV_REWARD_COLUMN",
    "GROUP_COLUMN",
    "OK_COLUMN",
    "AxolotlVerifyReward",
    "impute_failed",
    "nemo_gym_env_reward",
    "nemo_gym_verify_reward",
]

logger = logging.getLogger(__name__)

ENV_REWARD_COLUMN = "env_reward"
"""Per rollout: the reward the agent's ``/run`` returned (seed contract name)."""
OK_COLUMN = "nemo_gym_ok"
"""Per rollout: whether it completed (``RolloutStatus.OK``)."""
GROUP_COLUMN = "nemo_gym_group"
"""Per rollout: the key of its group of ``num_generations`` rollouts of one row."""


def impute_failed(
    rewards: Sequence[float | None], ok: Sequence[bool], groups: Sequence[str]
) -> list[float | None]:
    """Completed rollouts keep their reward; a failed one gets its group's completed mean.

    A group (rollouts sharing a key in ``groups``) with no completed rollout gets ``None``
    throughout.
    """
    if not len(rewards) == len(ok) == len(groups):
        raise ValueError(
            f"rewards ({len(rewards)}), ok ({len(ok)}) and groups ({len(groups)}) differ in length"
        )
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    for reward, good, group in zip(rewards, ok, groups, strict=True):
        if good and reward is not None:
            sums[group] = sums.get(group, 0.0) + float(reward)
            counts[group] = counts.get(group, 0) + 1
    out: list[float | None] = []
    for reward, good, group in zip(rewards, ok, groups, strict=True):
        if good and reward is not None:
            out.append(float(reward))
        elif counts.get(group):
            out.append(sums[group] / counts[group])
        else:
            out.append(None)
    return out


def _column(kwargs: Mapping[str, Any], name: str, n: int, who: str) -> list[Any]:
    values = kwargs.get(name)
    if values is None:
        raise DataError(
            f"{who} needs the {name!r} column of the NeMo Gym data producer, and the batch has "
            f"none (columns: {sorted(kwargs)}). List nemogym_sdk.adapters.axolotl.NemoGymPlugin "
            "under plugins: with nemo_gym_multi_turn: true."
        )
    values = list(values)
    if len(values) != n:
        raise DataError(f"{who}: {name!r} has {len(values)} values for {n} completions")
    return values


def nemo_gym_env_reward(
    completions: Sequence[Any], prompts: Sequence[Any] | None = None, **kwargs: Any
) -> list[float | None]:
    """Agent mode's reward: each episode's reward as its agent reported it.

    Reads the data producer's columns ``env_reward``, ``nemo_gym_ok`` and
    ``nemo_gym_group``; failed rollouts get their group's completed mean (see the module
    docstring). A batch without those columns is an error, never a row of zeros.
    """
    n = len(completions)
    who = "nemo_gym_env_reward"
    rewards = [float(r) for r in _column(kwargs, ENV_REWARD_COLUMN, n, who)]
    ok = [bool(v) for v in _column(kwargs, OK_COLUMN, n, who)]
    groups = [str(g) for g in _column(kwargs, GROUP_COLUMN, n, who)]
    return impute_failed(rewards, ok, groups)


class AxolotlVerifyReward:
    """Single-turn reward: ``/seed_session`` + ``/verify`` for each completion, concurrently.

    A module-level instance, ``nemo_gym_verify_reward``, is what YAML lists; the plugin
    calls ``bind`` once at start (with the discovered deployment's ``Verifier``), and
    ``unbind`` at the end. Called unbound it raises: it never guesses a server or scores 0.
    Scoring is the SDK's one ``/verify`` scorer (``Verifier.score``: each row's resources
    server in its documented order, ``nemo_gym_resources_server`` being the default for
    rows that name none).

    How a failure maps (``bind(impute=...)``): under axolotl's deferred scoring a failed
    completion gets its group's completed mean (``impute_failed``: advantage exactly 0,
    baseline untouched); under TRL's own scoring it gets ``None`` (unscorable).
    """

    __name__ = "nemo_gym_verify_reward"  # TRL names reward columns and metrics after it

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._verifier: Verifier | None = None
        self._default: str | None = None
        self._impute = True
        self.failures = 0
        """Completions whose verification failed so far (left out of the statistics)."""

    @property
    def bound(self) -> bool:
        """Whether the plugin has bound it to a deployment."""
        return self._verifier is not None

    def bind(
        self, verifier: Verifier, *, resources_server: str | None = None, impute: bool
    ) -> None:
        """Score with ``verifier``; ``resources_server`` is the default for rows that name
        none. ``impute``: give failures their group's completed mean (axolotl's deferred
        scoring) instead of ``None`` (TRL's unscorable path).
        """
        with self._lock:
            if self._verifier is not None and self._verifier is not verifier:
                raise ConfigError("nemo_gym_verify_reward is already bound to another deployment")
            self._verifier, self._default, self._impute = verifier, resources_server, impute

    def unbind(self) -> None:
        """Forget the deployment (and close the verifier's connections)."""
        with self._lock:
            verifier, self._verifier = self._verifier, None
        if verifier is not None:
            verifier.close()

    def __call__(
        self, completions: Sequence[Any], prompts: Sequence[Any] | None = None, **kwargs: Any
    ) -> list[float | None]:
        verifier = self._verifier
        if verifier is None:
            raise ConfigError(
                "nemo_gym_verify_reward is not bound to a NeMo Gym deployment: list "
                "nemogym_sdk.adapters.axolotl.NemoGymPlugin under plugins: (it binds it at start)"
            )
        n = len(completions)
        who = "nemo_gym_verify_reward"
        rows = [json.loads(text) for text in _column(kwargs, ROW, n, who)]
        row_ids = [str(i) for i in _column(kwargs, ROW_ID, n, who)]
        answers = [completion or "" for completion in completions]
        results = verifier.score(rows, answers, resources_server=self._default)
        ok = [r.status is RolloutStatus.OK and r.reward is not None for r in results]
        failed = [r for r, good in zip(results, ok, strict=True) if not good]
        if failed:
            self.failures += len(failed)
            logger.warning(
                "%d of %d completions could not be verified (left out of the group statistics); "
                "first: %s: %s",
                len(failed),
                n,
                failed[0].status.value,
                failed[0].error,
            )
        rewards = [r.reward for r in results]
        if self._impute:
            return impute_failed(rewards, ok, row_ids)
        return [r if good else None for r, good in zip(rewards, ok, strict=True)]


nemo_gym_verify_reward = AxolotlVerifyReward()
"""The single-turn reward function to list under ``trl.reward_funcs``."""
