"""The RL vocabulary of nemogym_sdk: frozen records shared by every layer.

- ``RolloutStatus``: how a rollout ended (``OK`` or the reason it cannot be trained on).
- ``DriftPolicy``: what the turn parser does when a turn's prompt does not extend the history.
- ``DriftReport``: where and how a token history diverged.
- ``Rollout``: one training sample built from one NeMo Gym ``/run`` result.
- ``Batch``: rollouts padded into numpy arrays (built by ``collate``).
- ``TaskRow``: one NeMo Gym dataset row, kept as opaque JSON with a stable id.
- ``RolloutRequest``: a row and its index within its group of ``num_generations``.

Token arrays are read-only numpy arrays (ids ``int64``, env mask ``int8``, logprobs
``float64``), so a frozen record really is immutable; change a record with
``attrs.evolve``.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import attrs
import numpy as np
import numpy.typing as npt

from nemogym_sdk import _extras
from nemogym_sdk.errors import ConfigError
from nemogym_sdk.wire import agent_name

if TYPE_CHECKING:
    import torch

__all__ = [
    "Batch",
    "DriftPolicy",
    "DriftReport",
    "ParseOptions",
    "Rollout",
    "RolloutRequest",
    "RolloutStatus",
    "TaskRow",
]

IntArray = npt.NDArray[np.int64]
MaskArray = npt.NDArray[np.int8]
FloatArray = npt.NDArray[np.float64]


class RolloutStatus(enum.StrEnum):
    """How a rollout ended. Only ``OK`` rollouts are meant for the loss and the group baseline."""

    OK = "ok"
    """The episode completed and its tokens, mask and logprobs are consistent."""
    AGENT_ERROR = "agent_error"
    """The agent answered with an error (an ``error`` field or an HTTP error status)."""
    TRANSPORT_ERROR = "transport_error"
    """The request never got a usable answer: connection refused, reset, or a broken body."""
    TIMEOUT = "timeout"
    """A connect, ``/run`` or total deadline passed."""
    EMPTY = "empty"
    """The agent produced no output, or no tool call and no non-empty text."""
    NO_TOKEN_IDS = "no_token_ids"
    """No model turn carried token ids: the model server is not configured for training
    (``return_token_id_information: true``)."""
    DRIFT = "drift"
    """A turn's prompt did not start with the tokens seen so far (``DriftPolicy.MARK``)."""
    INVALID = "invalid"
    """The result is malformed: wrong types, missing prompt ids, or a logprob count that
    differs from the generated token count."""
    MASKED = "masked"
    """The environment asked to leave this sample out (``mask_sample: true``)."""


class DriftPolicy(enum.StrEnum):
    """What ``parse_agent_response`` does when a turn's prompt does not extend the history."""

    RAISE = "raise"
    """Raise ``DriftError`` with the drift report."""
    MARK = "mark"
    """Return the tokens before the drift with status ``DRIFT`` (excluded from training)."""
    FORK = "fork"
    """Start a new sample at the drift point; the extra samples are ``Rollout.forks``."""


def _readonly(array: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    array.setflags(write=False)
    return array


def _ids(value: Any) -> IntArray:
    return readonly_array(value, np.int64)


def _mask(value: Any) -> MaskArray:
    return readonly_array(value, np.int8)


def _floats(value: Any) -> FloatArray:
    return readonly_array(value, np.float64)


def readonly_array(value: Any, dtype: type[np.generic]) -> npt.NDArray[Any]:
    """``value`` as a read-only 1-D array of ``dtype`` (a copy, unless it already is one).

    The converter of every array field of the SDK's frozen records.
    """
    if isinstance(value, np.ndarray) and value.dtype == dtype and not value.flags.writeable:
        return value
    array = np.array(value, dtype=dtype, copy=True)
    if array.ndim != 1:
        raise ValueError(f"expected a 1-D sequence, got shape {array.shape}")
    return _readonly(array)


def _float_dict(value: Mapping[str, float]) -> dict[str, float]:
    return {str(k): float(v) for k, v in value.items()}


_array_eq = attrs.cmp_using(eq=np.array_equal)


def _frozen_view(value: Any) -> npt.NDArray[Any]:
    """``value`` as a read-only array: a read-only view of an array (the caller's own
    array stays writable; no copy), a new read-only array of anything else."""
    array = value.view() if isinstance(value, np.ndarray) else np.asarray(value)
    array.setflags(write=False)
    return array


def _frozen_views(value: Mapping[str, Any]) -> dict[str, npt.NDArray[Any]]:
    return {str(k): _frozen_view(v) for k, v in value.items()}


@attrs.frozen(kw_only=True)
class DriftReport:
    """Where a model turn's prompt stopped extending the token history."""

    turn_index: int
    """0-based index of the model turn whose prompt drifted."""
    output_index: int
    """Index of that turn's item in ``response.output``."""
    common_prefix: int
    """Number of leading tokens the drifted prompt shares with the history."""
    history_length: int
    """Length of the history: previous turn's prompt plus its generation."""
    prompt_length: int
    """Length of the drifted turn's ``prompt_token_ids``."""
    expected: tuple[int, ...]
    """History tokens around the divergence (a window starting a few tokens before it)."""
    received: tuple[int, ...]
    """Prompt tokens over the same window."""
    expected_text: str | None = None
    """``expected`` decoded with the caller's ``decode``, when one was given."""
    received_text: str | None = None
    """``received`` decoded with the caller's ``decode``, when one was given."""

    def __str__(self) -> str:
        lines = [
            f"token drift at model turn {self.turn_index} (output item {self.output_index}): "
            f"the prompt ({self.prompt_length} tokens) shares only {self.common_prefix} leading "
            f"tokens with the history ({self.history_length} tokens)",
            f"  history: {list(self.expected)}",
            f"  prompt:  {list(self.received)}",
        ]
        if self.expected_text is not None or self.received_text is not None:
            lines.append(f"  history text: {self.expected_text!r}")
            lines.append(f"  prompt text:  {self.received_text!r}")
        return "\n".join(lines)


def _check_lengths(instance: Rollout, attribute: attrs.Attribute[Any], value: Any) -> None:
    n = len(instance.completion_ids)
    if len(instance.env_mask) != n or len(instance.logprobs) != n:
        raise ValueError(
            f"Rollout arrays disagree: completion_ids has {n} tokens, env_mask "
            f"{len(instance.env_mask)}, logprobs {len(instance.logprobs)}"
        )


def _optional_ids(value: Any) -> IntArray | None:
    return None if value is None else _ids(value)


def _optional_array_eq(a: Any, b: Any) -> bool:
    if a is None or b is None:
        return a is b
    return bool(np.array_equal(a, b))


def _check_versions(instance: Rollout, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value is not None and len(value) != len(instance.completion_ids):
        raise ValueError(
            f"Rollout.versions has {len(value)} entries for {len(instance.completion_ids)} "
            "completion tokens"
        )


def _versions_tuple(value: Any) -> tuple[int | None, ...]:
    return tuple(None if v is None else int(v) for v in value)


@attrs.frozen(kw_only=True)
class Rollout:
    """One training sample built from one NeMo Gym ``/run`` result.

    The completion interleaves policy tokens (``env_mask`` 1, with their sampling
    logprobs) and environment tokens such as tool outputs and chat-template glue
    (``env_mask`` 0, logprob 0.0). A failed rollout keeps the seed contract's shape
    (prompt ``[eos]``, completion ``[eos]``, mask ``[0]``) and says why in ``status``.
    """

    prompt_ids: IntArray = attrs.field(converter=_ids, eq=_array_eq)
    """Token ids of the first model turn's prompt, shape ``[P]``."""
    completion_ids: IntArray = attrs.field(converter=_ids, eq=_array_eq)
    """Generated and environment tokens after the prompt, shape ``[T]``."""
    env_mask: MaskArray = attrs.field(converter=_mask, eq=_array_eq)
    """1 where the policy generated the token, 0 for environment tokens, shape ``[T]``."""
    logprobs: FloatArray = attrs.field(converter=_floats, eq=_array_eq, validator=_check_lengths)
    """Sampling logprob of each completion token (0.0 on environment tokens), shape ``[T]``."""
    reward: float = attrs.field(converter=float)
    """Episode reward as the environment reported it (the seed's value for failures)."""
    num_turns: int = 0
    """Number of model turns whose tokens are in this sample."""
    status: RolloutStatus = RolloutStatus.OK
    """How the rollout ended; only ``OK`` samples belong in the loss and the baseline."""
    error: str | None = None
    """Why the rollout is not ``OK``: a sentence, or the drift report."""
    reward_components: Mapping[str, float] = attrs.field(factory=dict, converter=_float_dict)
    """Named reward terms, when the environment returns ``reward_components``."""
    truncated: bool = False
    """The completion was cut to ``max_completion_length``."""
    row_id: str | None = None
    """Stable id of the dataset row this rollout played (``file:line``)."""
    repeat_index: int | None = None
    """Index of this rollout within its row's group of ``num_generations``."""
    agent_name: str | None = None
    """Agent instance that played the episode."""
    drift: DriftReport | None = None
    """Where the history drifted, for ``DRIFT`` rollouts and for forks that start at a drift."""
    forks: tuple[Rollout, ...] = ()
    """Further samples from the same episode, each starting at a drift point (``FORK`` policy)."""
    turn_versions: tuple[int | None, ...] = attrs.field(default=(), converter=_versions_tuple)
    """Per model turn in this sample, the policy (adapter) version that generated it, as the
    sampler reported it on the turn (``nemogym_sdk.wire.versions``); None for a turn whose
    sampler did not say. Empty for failures."""
    versions: IntArray | None = attrs.field(
        default=None,
        converter=_optional_ids,
        eq=attrs.cmp_using(eq=_optional_array_eq),
        validator=_check_versions,
    )
    """``[T]`` the version that generated each completion token (``turn_versions`` spread over
    the turns' tokens); -1 on environment tokens and on turns without a version. None when no
    turn has one."""

    @classmethod
    def failed(
        cls,
        status: RolloutStatus,
        eos_token_id: int,
        *,
        error: str | None = None,
        reward: float = 0.0,
        reward_components: Mapping[str, float] | None = None,
    ) -> Rollout:
        """A rollout that cannot be trained on, in the seed contract's one-token shape."""
        if status is RolloutStatus.OK:
            raise ValueError("a failed rollout needs a status other than OK")
        return cls(
            prompt_ids=_readonly(np.array([eos_token_id], dtype=np.int64)),
            completion_ids=_readonly(np.array([eos_token_id], dtype=np.int64)),
            env_mask=_readonly(np.zeros(1, dtype=np.int8)),
            logprobs=_readonly(np.zeros(1, dtype=np.float64)),
            reward=reward if math.isfinite(reward) else 0.0,
            status=status,
            error=error,
            reward_components=dict(reward_components or {}),
        )

    @property
    def ok(self) -> bool:
        """Whether the sample belongs in the loss and the group baseline."""
        return self.status is RolloutStatus.OK

    @property
    def oldest_version(self) -> int | None:
        """The oldest policy version among the turns that report one (None: none does)."""
        known = [v for v in self.turn_versions if v is not None]
        return min(known) if known else None

    def samples(self) -> tuple[Rollout, ...]:
        """This sample followed by its forks, in episode order."""
        return (self, *self.forks)

    def to_dict(self) -> dict[str, Any]:
        """The seed contract's dict: plain Python lists, ints and floats."""
        return {
            "prompt_ids": self.prompt_ids.tolist(),
            "completion_ids": self.completion_ids.tolist(),
            "env_mask": self.env_mask.tolist(),
            "logprobs": self.logprobs.tolist(),
            "reward": float(self.reward),
            "num_turns": int(self.num_turns),
        }


@attrs.frozen(kw_only=True)
class TaskRow:
    """One NeMo Gym dataset row: opaque JSON plus a stable id.

    Rows are never looked up by prompt text (rows that share a prompt would collide);
    ``row_id`` identifies them. Treat ``data`` as read-only: request builders copy it.
    """

    row_id: str
    """Stable id, ``<path>:<line>`` for rows read from a file."""
    data: Mapping[str, Any] = attrs.field(eq=False)
    """The row as decoded JSON: ``responses_create_params``, ``agent_ref`` and task fields."""
    source: str | None = None
    """File the row was read from."""
    line: int | None = None
    """1-based line number in ``source``."""

    @property
    def agent_name(self) -> str | None:
        """``agent_ref.name`` of the row, if it names an agent."""
        return agent_name(self.data)


@attrs.frozen(kw_only=True)
class ParseOptions:
    """How ``/run`` results become rollouts: one record that travels from the caller
    (``AgentClient.run``, ``stream``, ``run_sync``, ``to_rollout``) to the parser."""

    on_drift: DriftPolicy | str = DriftPolicy.MARK
    """What to do when a turn's prompt does not extend the history."""
    max_completion_length: int | None = None
    """Cut completions (ids, mask and logprobs together) to this many tokens."""
    decode: Callable[[Sequence[int]], str] | None = attrs.field(default=None, eq=False)
    """Optional ``ids -> text`` (e.g. ``tokenizer.decode``) for readable drift reports."""


@attrs.frozen(kw_only=True)
class RolloutRequest:
    """One rollout to play: a row and its index within the row's group."""

    row: TaskRow
    """The dataset row to send to the agent."""
    repeat_index: int = 0
    """0-based index within the group of ``num_generations`` rollouts of this row."""
    seed: int | None = None
    """The sampling seed of the rollout's model turns (``AgentClient`` sends it with them,
    as ``wire.with_seed`` writes it), or None: the sampler draws its own. The same seed and
    policy play the same tokens on ``nemogym_sdk.serve``'s own sampler, which mixes the
    seed with each turn's prompt length so that the turns of one episode draw apart."""

    def __attrs_post_init__(self) -> None:
        if self.seed is not None and (
            isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0
        ):
            raise ConfigError(f"a rollout's seed must be an integer >= 0, got {self.seed!r}")


_TORCH_DTYPES = {
    "prompt_ids": "long",
    "prompt_mask": "long",
    "completion_ids": "long",
    "completion_mask": "long",
    "env_mask": "long",
    "loss_mask": "long",
    "logprobs": "float32",
    "rewards": "float32",
    "ok": "bool",
    "truncated": "bool",
    "num_turns": "long",
    "episode_index": "long",
}


@attrs.frozen(kw_only=True, eq=False)
class Batch:
    """Rollouts padded into arrays: ``B`` rows, prompts left-padded to ``P``, completions
    right-padded to ``T``. Build one with ``nemogym_sdk.collate``.

    Masks come from recorded lengths, never from comparing ids with the pad id (the pad
    id may equal the eos id). Every array is read-only, like ``Rollout``'s (arrays
    passed in are wrapped in read-only views, not copied).
    """

    prompt_ids: npt.NDArray[np.int64] = attrs.field(converter=_frozen_view)
    """``[B, P]`` prompt ids, left-padded with the pad id."""
    prompt_mask: npt.NDArray[np.int8] = attrs.field(converter=_frozen_view)
    """``[B, P]`` 1 on real prompt tokens, 0 on padding."""
    completion_ids: npt.NDArray[np.int64] = attrs.field(converter=_frozen_view)
    """``[B, T]`` completion ids, right-padded with the pad id."""
    completion_mask: npt.NDArray[np.int8] = attrs.field(converter=_frozen_view)
    """``[B, T]`` 1 on real completion tokens, 0 on padding."""
    env_mask: npt.NDArray[np.int8] = attrs.field(converter=_frozen_view)
    """``[B, T]`` 1 on policy tokens, 0 on environment tokens; padding is 1 (TRL's convention)."""
    logprobs: npt.NDArray[np.float32] = attrs.field(converter=_frozen_view)
    """``[B, T]`` sampling logprobs; 0.0 on environment tokens and padding."""
    rewards: npt.NDArray[np.float32] = attrs.field(converter=_frozen_view)
    """``[B]`` rewards as reported (failed rollouts carry the seed's value, see ``ok``)."""
    statuses: npt.NDArray[np.str_] = attrs.field(converter=_frozen_view)
    """``[B]`` ``RolloutStatus`` values as strings."""
    truncated: npt.NDArray[np.bool_] = attrs.field(converter=_frozen_view)
    """``[B]`` whether the completion was cut to ``max_completion_length``."""
    num_turns: npt.NDArray[np.int64] = attrs.field(converter=_frozen_view)
    """``[B]`` model turns per sample."""
    episode_index: npt.NDArray[np.int64] = attrs.field(converter=_frozen_view)
    """``[B]`` index of the input rollout each row came from (forks share it)."""
    row_ids: tuple[str | None, ...]
    """``[B]`` dataset row ids."""
    repeat_indices: npt.NDArray[np.int64] = attrs.field(converter=_frozen_view)
    """``[B]`` index within the row's group, -1 when unknown."""
    reward_components: Mapping[str, npt.NDArray[np.float32]] = attrs.field(converter=_frozen_views)
    """Per named reward term, a ``[B]`` array; NaN where a row does not report that term."""
    versions: npt.NDArray[np.int64] = attrs.field(converter=_frozen_view)
    """``[B, T]`` the policy version that generated each token (``Rollout.versions``); -1 on
    environment tokens, padding, and tokens whose sampler did not report a version."""

    def __len__(self) -> int:
        return int(self.prompt_ids.shape[0])

    @property
    def ok(self) -> npt.NDArray[np.bool_]:
        """``[B]`` True where the status is ``OK``."""
        return np.asarray(self.statuses == RolloutStatus.OK.value)

    @property
    def loss_mask(self) -> npt.NDArray[np.int8]:
        """``[B, T]`` ``completion_mask * env_mask * ok``: the tokens a policy loss may touch.

        1 on the policy tokens of ``OK`` rows only: every row that is not ``OK`` (a failure,
        ``DRIFT``, ``MASKED``) is all 0, so a loop that trains on ``loss_mask`` never trains
        on it, even without reading ``ok``. (``env_mask`` keeps the tokens' roles for every
        row.)
        """
        ok_B1 = self.ok[:, None].astype(np.int8)
        return self.completion_mask * self.env_mask * ok_B1

    @property
    def oldest_versions(self) -> npt.NDArray[np.int64]:
        """``[B]`` the oldest version among each row's tokens, -1 for a row with none."""
        known_BT = self.versions >= 0
        if self.versions.shape[1] == 0:
            return np.full(len(self), -1, dtype=np.int64)
        big = np.iinfo(np.int64).max
        oldest_B = np.where(known_BT, self.versions, big).min(axis=1)
        return np.where(known_BT.any(axis=1), oldest_B, -1).astype(np.int64)

    def staleness(self, learner_version: int) -> npt.NDArray[np.int64]:
        """``[B, T]`` how many versions the policy had moved on when it learns from each
        token: ``learner_version - versions`` on ``loss_mask`` tokens with a known version,
        -1 everywhere else. ``learner_version`` is the version of the weights ``train_step``
        starts from (0 before the first step; the version the sampler got after step k is
        k + 1)."""
        counted_BT = (self.loss_mask > 0) & (self.versions >= 0)
        return np.where(counted_BT, learner_version - self.versions, -1).astype(np.int64)

    def to_torch(self, device: str | torch.device | None = None) -> dict[str, torch.Tensor]:
        """The numeric arrays as torch tensors on ``device`` (torch is imported here, lazily).

        Keys: ``prompt_ids, prompt_mask, completion_ids, completion_mask, env_mask, loss_mask``
        (int64; ``loss_mask`` is 0 on every row that is not OK, see ``loss_mask``), ``logprobs,
        rewards`` (float32), ``ok, truncated`` (bool), ``num_turns, episode_index`` (int64).
        """
        try:
            import torch
        except ImportError as exc:  # pragma: no cover - depends on the environment
            raise ImportError(_extras.needs("Batch.to_torch", ["torch"], "torch")) from exc
        out: dict[str, torch.Tensor] = {}
        for name, dtype in _TORCH_DTYPES.items():
            array = getattr(self, name)
            # a copy: torch cannot share a read-only array (it warns, and could write to it)
            out[name] = torch.from_numpy(np.array(array, order="C")).to(
                device=device, dtype=getattr(torch, dtype)
            )
        return out
