"""TRL reward functions: the environment's reward, and ``/verify`` for single-turn training.

Both return ``None`` for a completion that could not be scored. TRL (>= 1.6) treats a
completion every reward function returned ``None`` for as unscorable: it leaves the group
baseline and gets advantage 0. A failed rollout scored as 0.0 instead would pull its
group's mean down and hand its siblings a spurious advantage.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from nemogym_sdk.directory import ServerDirectory
from nemogym_sdk.errors import ConfigError
from nemogym_sdk.records import RolloutStatus, TaskRow
from nemogym_sdk.verify import Verifier, VerifyItem

from .dataset import ROW_ID_KEY

__all__ = ["VerifyReward", "make_verify_reward", "nemo_gym_reward"]

_OK = str(RolloutStatus.OK)


def nemo_gym_reward(
    completions: Sequence[Any], prompts: Sequence[Any] | None = None, **kwargs: Any
) -> list[float | None]:
    """The reward NeMo Gym's agent returned for each rollout; ``None`` for failed ones.

    Reads the extra fields ``make_rollout_func`` returns (TRL passes them as keyword
    arguments): ``env_reward`` and ``status``. When TRL offers ``log_metric`` it logs
    ``nemo_gym/ok_fraction`` and ``nemo_gym/num_turns``; with ``log_extra`` each
    rollout's status goes into the completions table.

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
    log_metric = kwargs.get("log_metric")
    if callable(log_metric) and scores:
        log_metric("nemo_gym/ok_fraction", sum(s is not None for s in scores) / len(scores))
        turns = kwargs.get("num_turns")
        if turns:
            log_metric("nemo_gym/num_turns", sum(turns) / len(turns))
    log_extra = kwargs.get("log_extra")
    if callable(log_extra):
        log_extra("nemo_gym_status", list(statuses))
    return scores


class VerifyReward:
    """A TRL reward function that scores each completion with its row's ``/verify``.

    For single-turn training, where TRL generates the completion itself. Each
    completion's row is found by the dataset's ``nemo_gym_row_id`` column
    (``make_dataset``) and sent whole (``responses_create_params`` and task fields) with
    the completion to its resources server (``resources_server``, else the one its
    agent uses, else the only one deployed); ``/seed_session`` is called first.
    Scoring runs concurrently, on one ``Verifier`` kept for the whole run. A completion
    that could not be scored (HTTP failure, no reward) gets ``None`` and is counted.
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
        known = self._verifier.directory.resources_servers
        if resources_server is not None and resources_server not in known:
            raise ConfigError(
                f"unknown resources server {resources_server!r}; known: {', '.join(known)}"
            )
        self.resources_server = resources_server
        """The resources server that scores every completion; None: each row's agent's."""
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
        scores: list[float | None] = [None] * len(completions)
        items, positions = [], []
        for position, (row_id, completion) in enumerate(zip(ids, completions, strict=True)):
            row = self._rows.get(row_id)
            if row is None:
                raise ConfigError(
                    f"row {row_id!r} is not among the rows given to make_verify_reward; pass it "
                    "the rows the dataset was built from"
                )
            server = self._server_for(row)
            items.append(VerifyItem(resources_server=server, row=row.data, completion=completion))
            positions.append(position)
        for position, result in zip(positions, self._verifier.verify_sync(items), strict=True):
            if result.status is RolloutStatus.OK and result.reward is not None:
                scores[position] = result.reward
        with self._lock:
            self.failures += sum(score is None for score in scores)
        return scores

    def _server_for(self, row: TaskRow) -> str:
        """The explicit server, else the one the row's agent uses, else the only one."""
        if self.resources_server is not None:
            return self.resources_server
        directory = self._verifier.directory
        agent = row.agent_name
        server = directory.resources_server_of(agent) if agent is not None else None
        if server is None and len(directory.resources_servers) == 1:
            server = next(iter(directory.resources_servers))
        if server is None:
            raise ConfigError(
                f"cannot tell which resources server scores row {row.row_id} (agent "
                f"{agent!r}); pass resources_server= to make_verify_reward"
            )
        return server

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
) -> VerifyReward:
    """A reward function scoring completions through ``/verify`` (see :class:`VerifyReward`).

    Args:
        servers: resources server name -> URL, or a ``ServerDirectory``.
        rows: the rows the dataset was built from (``make_dataset``).
        resources_server: the instance that scores every completion; default the one
            each row's agent uses (or the only one deployed).
        model_name: ``model`` of the Responses object sent to ``/verify``.
        verifier_options: more ``Verifier`` options (``timeouts``, ``retry``, ...).
    """
    return VerifyReward(
        servers, rows, resources_server=resources_server, model_name=model_name, **verifier_options
    )
