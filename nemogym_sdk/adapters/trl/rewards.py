"""TRL reward functions: the environment's reward, and ``/verify`` for single-turn training.

Both return ``None`` for a completion that could not be scored (TRL's mapping of a
failure; the SDK's ``/verify`` scorer itself returns typed results). TRL (>= 1.6) treats a
completion every reward function returned ``None`` for as unscorable: it leaves the group
baseline and gets advantage 0. A failed rollout scored as 0.0 instead would pull its
group's mean down and hand its siblings a spurious advantage.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from nemogym_sdk.directory import ServerDirectory
from nemogym_sdk.errors import ConfigError, DiscoveryError
from nemogym_sdk.records import RolloutStatus, TaskRow
from nemogym_sdk.verify import Verifier, resources_server_for

from .dataset import ROW_ID_KEY

__all__ = ["TRLVerifyReward", "make_verify_reward", "nemo_gym_reward"]

_OK = str(RolloutStatus.OK)


def nemo_gym_reward(
    completions: Sequence[Any], prompts: Sequence[Any] | None = None, **kwargs: Any
) -> list[float | None]:
    """The reward NeMo Gym's agent returned for each rollout; ``None`` for failed ones.

    Reads the extra fields ``make_rollout_func`` returns (TRL passes them as keyword
    arguments): ``env_reward`` and ``status``. With ``log_extra`` each rollout's status
    goes into the completions table. (The step metrics, ``nemo_gym/ok_fraction`` and the
    rest of ``nemogym_sdk.metrics.RolloutStats``, are logged by the rollout function.)

    Raises ``ConfigError`` when ``env_reward`` is absent: the trainer was not given
    ``make_rollout_func``'s rollout function, and zeros would train on nothing.
    """
    rewards = kwargs.get("env_reward")
    if rewards is None:
        raise ConfigError(
            "nemo_gym_reward found no env_reward: pass rollout_func=make_rollout_func(...) "
            "to GRPOTrainer (for single-turn training use make_verify_reward)"
        )
    statuses = kwargs.get("status") or [_OK] * len(completions)
    if len(rewards) != len(completions) or len(statuses) != len(completions):
        raise ConfigError(
            f"{len(completions)} completions but {len(rewards)} env_reward and "
            f"{len(statuses)} status values"
        )
    scores = [
        float(reward) if reward is not None and status == _OK else None
        for reward, status in zip(rewards, statuses, strict=True)
    ]
    log_extra = kwargs.get("log_extra")
    if callable(log_extra):
        log_extra("nemo_gym_status", list(statuses))
    return scores


class TRLVerifyReward:
    """A TRL reward function that scores each completion with its row's ``/verify``.

    For single-turn training, where TRL generates the completion itself. Each
    completion's row is found by the dataset's ``nemo_gym_row_id`` column
    (``make_dataset``) and scored by the SDK's one ``/verify`` scorer
    (``nemogym_sdk.Verifier.score``: ``/seed_session`` first, the resources server chosen
    in its documented order, ``resources_server`` being the default for rows that name
    none). Every row's server is resolved here, at construction, so a deployment that
    cannot score some row is a ``DiscoveryError`` before training starts.

    How a failure maps: a completion that could not be scored (HTTP failure, no reward, a
    masked sample) gets ``None``, TRL's "unscorable": TRL (>= 1.6) leaves it out of the
    group baseline and gives it advantage 0. Failures are counted in ``failures``.
    """

    __name__ = "nemo_gym_verify"

    def __init__(
        self,
        servers: Mapping[str, str] | ServerDirectory,
        rows: Iterable[TaskRow],
        *,
        resources_server: str | None = None,
        model_name: str = "policy",
        **verifier_options: Any,
    ) -> None:
        self._rows = {row.row_id: row for row in rows}
        self._verifier = Verifier(servers, model_name=model_name, **verifier_options)
        for row in self._rows.values():  # fail now, naming the row, rather than per batch
            try:
                resources_server_for(row.data, self._verifier.directory, default=resources_server)
            except DiscoveryError as exc:
                self._verifier.close()
                raise DiscoveryError(f"row {row.row_id}: {exc}") from None
        self.resources_server = resources_server
        """The default resources server for rows that name none (None: the agent's, or the
        only one deployed)."""
        self._lock = threading.Lock()
        self.failures = 0
        """Completions scored ``None`` so far."""

    def __call__(
        self, completions: Sequence[Any], prompts: Sequence[Any] | None = None, **kwargs: Any
    ) -> list[float | None]:
        ids = kwargs.get(ROW_ID_KEY)
        if ids is None or len(ids) != len(completions):
            raise ConfigError(
                f"{self.__name__} needs the dataset column {ROW_ID_KEY!r} (one per completion); "
                "build the dataset with nemogym_sdk.adapters.trl.make_dataset(rows)"
            )
        rows = []
        for row_id in ids:
            row = self._rows.get(row_id)
            if row is None:
                raise ConfigError(
                    f"row {row_id!r} is not among the rows given to make_verify_reward; pass it "
                    "the rows the dataset was built from"
                )
            rows.append(row.data)
        results = self._verifier.score(rows, completions, resources_server=self.resources_server)
        scores = [r.reward if r.status is RolloutStatus.OK else None for r in results]
        with self._lock:
            self.failures += sum(score is None for score in scores)
        return scores

    def close(self) -> None:
        """Close the verifier's HTTP session and loop thread."""
        self._verifier.close()


def make_verify_reward(
    servers: Mapping[str, str] | ServerDirectory,
    rows: Iterable[TaskRow],
    *,
    resources_server: str | None = None,
    model_name: str = "policy",
    **verifier_options: Any,
) -> TRLVerifyReward:
    """A reward function scoring completions through ``/verify`` (see :class:`TRLVerifyReward`).

    Args:
        servers: resources server name -> URL, or a ``ServerDirectory``.
        rows: the rows the dataset was built from (``make_dataset``).
        resources_server: the default resources server for rows that name none in their
            ``resources_server_ref``; without it, the one each row's agent uses (or the
            only one deployed). See ``nemogym_sdk.verify`` for the order.
        model_name: ``model`` of the Responses object sent to ``/verify``.
        verifier_options: more ``Verifier`` options (``timeouts``, ``retry``, ...).
    """
    return TRLVerifyReward(
        servers, rows, resources_server=resources_server, model_name=model_name, **verifier_options
    )
