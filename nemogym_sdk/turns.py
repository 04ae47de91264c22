"""The turn parser: a NeMo Gym ``/run`` result becomes a training ``Rollout``.

The walk (the algorithm NeMo RL, verl, TRL's removed example and axolotl each wrote):
items of ``response.output`` with non-empty ``generation_token_ids`` are model turns.
The first turn's ``prompt_token_ids`` is the prompt. For every later turn, the history
(previous prompt + previous generation) must be a prefix of its ``prompt_token_ids``;
the new suffix is environment tokens (mask 0, logprob 0.0), then the generation (mask
1, its logprobs). Two turns, drawn with tiny tokens::

    turn 0   prompt [10 20]                  generation [30 31]
    turn 1   prompt [10 20 30 31 100 101 102] generation [40 41]
                    ^^^^^^^^^^^ history      ^^^^^^^^^^^ environment tokens

    prompt_ids     [10 20]
    completion_ids [30 31 100 101 102 40 41]
    env_mask       [ 1  1   0   0   0  1  1]

When a prompt does not extend the history (the chat template re-rendered it, a
reasoning block was stripped, the backend re-tokenized), the ``DriftPolicy`` decides:
raise, mark the rollout ``DRIFT``, or fork a new sample at the drift point. Nothing is
ever silently misaligned, and the parser never raises on malformed input except under
``DriftPolicy.RAISE``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import attrs
import numpy as np
import numpy.typing as npt

from nemogym_sdk.errors import ConfigError, DriftError
from nemogym_sdk.masks import CompletionBuilder
from nemogym_sdk.records import DriftPolicy, DriftReport, Rollout, RolloutStatus
from nemogym_sdk.wire import ModelTurn, RunResult, decode_run_result
from nemogym_sdk.wire.names import NG_TIMEOUT_FAILURES, NG_TRANSPORT_FAILURES

__all__ = ["parse_agent_response"]

Decode = Callable[[Sequence[int]], str]
"""Turns token ids into text, e.g. ``tokenizer.decode``; used for drift reports."""

_DRIFT_WINDOW = 16


def parse_agent_response(
    response: bytes | bytearray | memoryview | str | Any,
    eos_token_id: int,
    *,
    on_drift: DriftPolicy | str = DriftPolicy.MARK,
    max_completion_length: int | None = None,
    decode: Decode | None = None,
    row_id: str | None = None,
    repeat_index: int | None = None,
) -> Rollout:
    """Build a ``Rollout`` from one agent ``/run`` result.

    Args:
        response: the ``/run`` result as raw JSON bytes (fastest) or a decoded dict.
        eos_token_id: token used for the seed contract's one-token failure rollout.
        on_drift: what to do when a turn's prompt does not extend the history.
        max_completion_length: cut the completion (ids, mask and logprobs together) to
            this many tokens and set ``truncated``.
        decode: optional ``ids -> text`` used to add readable text to drift reports.
        row_id: the stable id of the dataset row this episode played, stamped on the
            rollout and on every fork (failures included), so that ``compute_advantages``
            can group a hand-parsed result; ``AgentClient`` stamps it itself.
        repeat_index: the episode's index within its row's group, stamped the same way.

    Returns:
        A ``Rollout``. Failures keep the seed contract's defaults (prompt and completion
        ``[eos]``, mask ``[0]``) and carry a non-OK ``status`` and an ``error``.

    Raises:
        DriftError: only under ``DriftPolicy.RAISE``, when a prompt drifts.
        ConfigError: for invalid arguments (not for invalid responses).
    """
    policy = _check_arguments(eos_token_id, on_drift, max_completion_length)
    _check_identity(row_id, repeat_index)
    result = decode_run_result(response)
    rollout = _failure(result, eos_token_id)
    if rollout is None:
        rollout = _stitch(result, eos_token_id, policy, max_completion_length, decode)
    if row_id is None and repeat_index is None:
        return rollout
    repeat = None if repeat_index is None else int(repeat_index)
    return stamp(rollout, row_id=row_id, repeat_index=repeat)


def stamp(rollout: Rollout, **identity: Any) -> Rollout:
    """``rollout`` and its forks with the identity fields (``row_id``, ``repeat_index``,
    ``agent_name``) set; a field passed as None is set to None."""
    forks = tuple(attrs.evolve(fork, **identity) for fork in rollout.forks)
    return attrs.evolve(rollout, forks=forks, **identity)


def _check_identity(row_id: str | None, repeat_index: int | None) -> None:
    if row_id is not None and not isinstance(row_id, str):
        raise ConfigError(f"row_id must be a str, got {row_id!r}")
    if repeat_index is not None and (
        isinstance(repeat_index, bool)
        or not isinstance(repeat_index, (int, np.integer))
        or repeat_index < 0
    ):
        raise ConfigError(f"repeat_index must be an int >= 0, got {repeat_index!r}")


def _check_arguments(
    eos_token_id: int, on_drift: DriftPolicy | str, max_completion_length: int | None
) -> DriftPolicy:
    if type(eos_token_id) is not int and (
        isinstance(eos_token_id, bool) or not isinstance(eos_token_id, (int, np.integer))
    ):
        raise ConfigError(f"eos_token_id must be an int, got {eos_token_id!r}")
    if max_completion_length is not None and max_completion_length < 1:
        raise ConfigError(f"max_completion_length must be >= 1, got {max_completion_length}")
    if type(on_drift) is DriftPolicy:
        return on_drift
    try:
        return DriftPolicy(on_drift)
    except ValueError:
        choices = ", ".join(p.value for p in DriftPolicy)
        raise ConfigError(f"on_drift must be one of {choices}, got {on_drift!r}") from None


def _nemo_gym_failure_status(failure_class: str) -> RolloutStatus:
    """The status of a NeMo Gym failure row by its class: transport, deadline, or the
    episode's own failure (an agent error)."""
    if failure_class in NG_TRANSPORT_FAILURES:
        return RolloutStatus.TRANSPORT_ERROR
    if failure_class in NG_TIMEOUT_FAILURES:
        return RolloutStatus.TIMEOUT
    return RolloutStatus.AGENT_ERROR


def _failure(result: RunResult, eos: int) -> Rollout | None:
    """The seed contract's failure cases, in the seed's order, or None to go on (NeMo Gym's
    own failure rows first: they are no ``/run`` result at all)."""
    if result.failure_class is not None:
        status = _nemo_gym_failure_status(result.failure_class)
        return Rollout.failed(status, eos, error=result.error)
    kept = result.reward if result.reward is not None else 0.0
    components = result.reward_components
    if result.error is not None:
        reason = result.error.strip() or f"the agent returned an empty error ({result.error!r})"
        return Rollout.failed(RolloutStatus.AGENT_ERROR, eos, error=reason)
    if result.invalid is not None:
        return Rollout.failed(RolloutStatus.INVALID, eos, error=result.invalid, reward=kept)
    if result.reward is None:
        return Rollout.failed(RolloutStatus.INVALID, eos, error="'reward' is not a finite number")
    if result.num_output_items == 0:
        return Rollout.failed(
            RolloutStatus.EMPTY,
            eos,
            error="the agent returned no output",
            reward=kept,
            reward_components=components,
        )
    if not result.has_answer:
        return Rollout.failed(
            RolloutStatus.EMPTY,
            eos,
            error="the output has no function call and no non-empty message text",
            reward=kept,
            reward_components=components,
        )
    if not result.turns:
        return Rollout.failed(
            RolloutStatus.NO_TOKEN_IDS,
            eos,
            error=(
                "no output item carries generation_token_ids: configure the NeMo Gym "
                "model server for training (return_token_id_information: true)"
            ),
        )
    if result.turn_problem is not None:
        return Rollout.failed(
            RolloutStatus.INVALID,
            eos,
            error=result.turn_problem,
            reward=kept,
            reward_components=components,
        )
    return None


class _Segment:
    """A sample under construction: its prompt, its completion and its turn count."""

    __slots__ = ("builder", "drift", "num_turns", "prompt_ids", "spans", "turn_versions")

    def __init__(
        self,
        prompt_ids: npt.NDArray[np.int64],
        builder: CompletionBuilder,
        drift: DriftReport | None = None,
    ) -> None:
        self.prompt_ids = prompt_ids
        self.builder = builder
        self.num_turns = 0
        self.drift = drift
        self.turn_versions: list[int | None] = []
        self.spans: list[tuple[int, int, int]] = []  # (start, tokens, version) of versioned turns

    def add_turn(self, turn: ModelTurn) -> None:
        """The turn's generation, with its logprobs and (when known) its policy version."""
        assert turn.logprobs is not None  # _failure checked
        start = len(self.builder)
        self.builder.add_model_raw(turn.generation, turn.logprobs)
        self.num_turns += 1
        self.turn_versions.append(turn.version)
        if turn.version is not None:
            self.spans.append((start, len(self.builder) - start, turn.version))

    def versions(self, length: int) -> npt.NDArray[np.int64] | None:
        """Per token of the first ``length`` completion tokens, the version that made it."""
        if not self.spans:
            return None
        versions_T = np.full(len(self.builder), -1, dtype=np.int64)
        for start, n, version in self.spans:
            versions_T[start : start + n] = version
        return versions_T[:length]


def _stitch(
    result: RunResult,
    eos: int,
    policy: DriftPolicy,
    max_completion_length: int | None,
    decode: Decode | None,
) -> Rollout:
    segments: list[_Segment] = []
    drift: DriftReport | None = None
    previous: ModelTurn | None = None
    builder = CompletionBuilder()
    for number, turn in enumerate(result.turns):
        prompt = turn.prompt
        assert prompt is not None and turn.logprobs is not None  # _failure checked
        if previous is None:
            segments.append(_Segment(np.frombuffer(prompt, dtype=np.int64), builder))
        else:
            history = previous.prompt
            assert history is not None
            n_prompt = len(history)
            # history = previous prompt + previous generation: two memcmps, no copies
            if prompt.startswith(history) and prompt.startswith(previous.generation, n_prompt):
                builder.add_env_raw(prompt[n_prompt + len(previous.generation) :])
            else:
                drift = _drift_report(number, previous, turn, decode)
                if policy is DriftPolicy.RAISE:
                    raise DriftError(str(drift))
                if policy is DriftPolicy.MARK:
                    break
                builder = CompletionBuilder()
                segments.append(_Segment(np.frombuffer(prompt, dtype=np.int64), builder, drift))
        segments[-1].add_turn(turn)
        previous = turn

    status = RolloutStatus.MASKED if result.mask_sample else RolloutStatus.OK
    error = "the environment set mask_sample: true" if result.mask_sample else None
    if policy is DriftPolicy.MARK and drift is not None:
        status, error = RolloutStatus.DRIFT, str(drift)
    reward = result.reward if result.reward is not None else 0.0

    def finish(segment: _Segment, **extra: Any) -> Rollout:
        completion = segment.builder.build().truncate(max_completion_length)
        return Rollout(
            prompt_ids=segment.prompt_ids,
            completion_ids=completion.ids,
            env_mask=completion.env_mask,
            logprobs=completion.logprobs,
            reward=reward,
            num_turns=segment.num_turns,
            status=status,
            error=error,
            reward_components=result.reward_components,
            truncated=completion.truncated,
            turn_versions=segment.turn_versions,
            versions=segment.versions(len(completion)),
            **extra,
        )

    forks = tuple(finish(segment, drift=segment.drift) for segment in segments[1:])
    first_drift = drift if policy is DriftPolicy.MARK else None
    return finish(segments[0], forks=forks, drift=first_drift)


def _drift_report(
    number: int, previous: ModelTurn, turn: ModelTurn, decode: Decode | None
) -> DriftReport:
    assert previous.prompt_ids is not None and turn.prompt_ids is not None
    history = np.concatenate([previous.prompt_ids, previous.generation_ids])
    prompt = turn.prompt_ids
    n = min(history.shape[0], prompt.shape[0])
    mismatches = np.flatnonzero(history[:n] != prompt[:n])
    common = int(mismatches[0]) if mismatches.shape[0] else n
    start = max(0, common - _DRIFT_WINDOW // 4)
    stop = common + _DRIFT_WINDOW
    expected = tuple(int(t) for t in history[start:stop])
    received = tuple(int(t) for t in prompt[start:stop])
    expected_text = received_text = None
    if decode is not None:
        try:
            expected_text, received_text = decode(expected), decode(received)
        except Exception as exc:  # noqa: BLE001 - a report helper must not mask the drift
            expected_text = received_text = f"<decode failed: {exc!r}>"
    return DriftReport(
        turn_index=number,
        output_index=turn.output_index,
        common_prefix=common,
        history_length=int(history.shape[0]),
        prompt_length=int(prompt.shape[0]),
        expected=expected,
        received=received,
        expected_text=expected_text,
        received_text=received_text,
    )
