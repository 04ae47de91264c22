"""``rollout_func`` for TRL's ``GRPOTrainer``: NeMo Gym agents play the rows, by id.

TRL (>= 1.0) calls ``rollout_func(prompts, trainer)`` on every process with that
process's slice of the generation batch: one prompt per completion it will train on
(its sampler repeats each row ``num_generations`` times in a row). This function plays
each entry once through NeMo Gym's ``/run`` with ``AgentClient``, parses the episodes
and returns what TRL reads: ``prompt_ids``, ``completion_ids``, ``logprobs`` and
``env_mask`` (1 = policy token, 0 = environment token; TRL's ``tool_mask``), plus the
extra fields ``env_reward``, ``num_turns`` and ``status`` that TRL hands to the reward
functions (see :func:`~nemogym_sdk.adapters.trl.nemo_gym_reward`).
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from nemogym_sdk.client import AgentClient
from nemogym_sdk.collate import collate
from nemogym_sdk.directory import ServerDirectory
from nemogym_sdk.errors import ConfigError
from nemogym_sdk.metrics import RolloutStats, scalars
from nemogym_sdk.policy import RetryPolicy, SamplingParams, Timeouts
from nemogym_sdk.records import DriftPolicy, ParseOptions, Rollout, RolloutRequest, TaskRow

from .dataset import prompt_row_id

__all__ = ["NemoGymRolloutFunc", "make_rollout_func", "sampling_from_args"]

_DISABLED_TOP_K = (None, 0, -1)


def sampling_from_args(args: Any, *, max_tokens_per_turn: int | None = None) -> SamplingParams:
    """The trainer's sampling settings as the ``SamplingParams`` forced onto every row.

    The learner computes its logprobs at ``args.temperature``; the sampler must sample at
    the same temperature and ``top_p`` (set on every row, overriding the row's own).
    Settings that NeMo Gym's Responses API cannot carry (``top_k``, ``min_p``,
    ``repetition_penalty``, ``generation_kwargs``) raise ``ConfigError``: the learner
    would correct for processing the sampler never applied.
    """
    unsupported = []
    if getattr(args, "top_k", None) not in _DISABLED_TOP_K:
        unsupported.append(f"top_k={args.top_k}")
    if getattr(args, "min_p", None) not in (None, 0, 0.0):
        unsupported.append(f"min_p={args.min_p}")
    if getattr(args, "repetition_penalty", 1.0) not in (None, 1.0):
        unsupported.append(f"repetition_penalty={args.repetition_penalty}")
    if getattr(args, "generation_kwargs", None):
        unsupported.append(f"generation_kwargs={args.generation_kwargs}")
    if unsupported:
        raise ConfigError(
            f"GRPOConfig sets {', '.join(unsupported)}, which NeMo Gym's Responses API cannot "
            "pass to the sampler (it carries temperature, top_p and max_output_tokens); "
            "leave them at their defaults, or configure them on the inference server"
        )
    return SamplingParams(
        temperature=float(args.temperature),
        top_p=float(args.top_p),
        max_output_tokens=max_tokens_per_turn,
    )


def _eos_token_id(trainer: Any) -> int:
    tokenizer = getattr(trainer, "processing_class", None)
    tokenizer = getattr(tokenizer, "tokenizer", tokenizer)  # a processor wraps its tokenizer
    eos = getattr(tokenizer, "eos_token_id", None)
    if not isinstance(eos, int):
        raise ConfigError(
            "the trainer's processing_class has no integer eos_token_id; failed rollouts are "
            "one [eos] token"
        )
    return eos


def _expected(trainer: Any) -> int | None:
    """Completions per process per generation in training; None in evaluation."""
    if not trainer.model.training:
        return None
    args = trainer.args
    return int(args.per_device_train_batch_size) * int(args.steps_per_generation)


def _check_count(count: int, trainer: Any) -> None:
    expected = _expected(trainer)
    if expected is None or count == expected:
        return
    args = trainer.args
    generations = int(args.num_generations)
    message = (
        f"TRL passed {count} prompts to rollout_func on this process, but with "
        f"per_device_train_batch_size={args.per_device_train_batch_size} and "
        f"steps_per_generation={args.steps_per_generation} it trains on {expected} "
        "completions here, one per prompt (its sampler repeats each row "
        f"num_generations={generations} times)."
    )
    if count * generations == expected:
        message += (
            " This TRL passes each row once and expects num_generations completions per "
            "prompt, a contract this adapter does not support; use a TRL version in the "
            "supported range (nemogym_sdk.adapters.trl.MIN_TRL)."
        )
    raise ConfigError(message)


class NemoGymRolloutFunc:
    """The callable passed to ``GRPOTrainer(rollout_func=...)``; see :func:`make_rollout_func`.

    It owns an ``AgentClient`` (one HTTP session, its own event-loop thread), created at
    the first call, when the trainer's sampling settings are known. Close it with
    :meth:`close` (or ``with``) after training.
    """

    def __init__(
        self,
        agents: Mapping[str, str] | ServerDirectory,
        rows: Iterable[TaskRow],
        *,
        default_agent: str | None = None,
        max_tokens_per_turn: int | None = None,
        on_drift: DriftPolicy | str = DriftPolicy.MARK,
        timeouts: Timeouts = Timeouts(),
        retry: RetryPolicy = RetryPolicy(),
        max_concurrency: int = 256,
        seed: int | None = None,
    ) -> None:
        self._rows: dict[str, TaskRow] = {}
        for row in rows:
            if row.row_id in self._rows:
                raise ConfigError(f"two rows share the id {row.row_id!r}; row ids must be unique")
            self._rows[row.row_id] = row
        if not self._rows:
            raise ConfigError("make_rollout_func needs the rows of the training dataset")
        if DriftPolicy(on_drift) is DriftPolicy.FORK:
            raise ConfigError(
                "on_drift='fork' makes an episode several rows (its traces), but TRL takes "
                "exactly one completion per prompt and computes each group's baseline over its "
                "rows, so the episode would count several times; use 'mark' (drifted rollouts "
                "are left out) or 'raise', with a contiguous sampler (docs/concepts/drift.md)"
            )
        self._agents = agents
        self._default_agent = default_agent
        self._max_tokens_per_turn = max_tokens_per_turn
        self._on_drift = DriftPolicy(on_drift)
        self._client_options: dict[str, Any] = {
            "timeouts": timeouts,
            "retry": retry,
            "max_concurrency": max_concurrency,
            "seed": seed,
        }
        self._client: AgentClient | None = None
        self._lock = threading.Lock()
        self.last_rollouts: tuple[Rollout, ...] = ()
        """The rollouts of the latest call, in prompt order (for metrics and tests)."""
        self.last_stats: RolloutStats | None = None
        """The SDK's step metrics of the latest call (this process's rollouts)."""
        self.calls = 0
        """How many times TRL has called this function."""

    @property
    def rows(self) -> Mapping[str, TaskRow]:
        """The rows this function can play, by id."""
        return self._rows

    def _client_for(self, trainer: Any) -> AgentClient:
        with self._lock:
            if self._client is None:
                sampling = sampling_from_args(
                    trainer.args, max_tokens_per_turn=self._max_tokens_per_turn
                )
                self._client = AgentClient(
                    self._agents,
                    default_agent=self._default_agent,
                    sampling=sampling,
                    **self._client_options,
                )
            return self._client

    def _requests(self, prompts: Sequence[Any]) -> list[RolloutRequest]:
        seen: Counter[str] = Counter()
        requests = []
        for prompt in prompts:
            row_id = prompt_row_id(prompt)
            row = self._rows.get(row_id)
            if row is None:
                raise ConfigError(
                    f"the prompt names row {row_id!r}, which is not among the rows given to "
                    "make_rollout_func; pass it the rows the dataset was built from"
                )
            requests.append(RolloutRequest(row=row, repeat_index=seen[row_id]))
            seen[row_id] += 1
        return requests

    def __call__(self, prompts: Sequence[Any], trainer: Any) -> dict[str, list[Any]]:
        """Play one rollout per prompt; TRL's output dict, in prompt order."""
        if getattr(trainer, "use_vllm", False):
            raise ConfigError(
                "GRPOConfig(use_vllm=True) makes TRL push weights to a vLLM it manages, but the "
                "rollouts are sampled by the server NeMo Gym's model server points at (TRL's "
                "vLLM server has no OpenAI API for it); set use_vllm=False and sync the "
                "adapter there with LoraSyncCallback"
            )
        _check_count(len(prompts), trainer)
        requests = self._requests(prompts)
        eos = _eos_token_id(trainer)
        client = self._client_for(trainer)
        limit = getattr(trainer, "max_completion_length", None)
        parse = ParseOptions(on_drift=self._on_drift, max_completion_length=limit)
        rollouts = client.run_sync(requests, eos_token_id=eos, parse=parse)
        self.last_rollouts = tuple(rollouts)
        self.last_stats = RolloutStats.of(collate(rollouts, pad_token_id=eos))
        _log_stats(trainer, self.last_stats)
        self.calls += 1
        return to_trl_output(rollouts)

    def close(self) -> None:
        """Close the agent client (its HTTP session and loop thread)."""
        with self._lock:
            if self._client is not None:
                self._client.close()
                self._client = None

    def __enter__(self) -> NemoGymRolloutFunc:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _log_stats(trainer: Any, stats: RolloutStats) -> None:
    """Log the step metrics as ``nemo_gym/<name>`` through TRL's metric log (the one its
    reward functions' ``log_metric`` feeds: averaged over processes per logging step, and
    reported wherever the trainer's ``report_to`` sends its metrics)."""
    log_metric = getattr(trainer, "_log_metric", None)
    if not callable(log_metric):
        return
    for name, value in scalars(stats.as_metrics(), "nemo_gym/").items():
        if value == value:  # NaN (no OK rollout) stays out of TRL's running means
            log_metric(name, value)


def to_trl_output(rollouts: Sequence[Rollout]) -> dict[str, list[Any]]:
    """Rollouts as TRL's ``rollout_func`` output: token lists plus per-sample extra fields.

    A rollout that is not ``OK`` keeps its tokens (TRL needs one completion per prompt) but
    gets an all-zero ``env_mask``, so none of its tokens is trained, not even by a KL term,
    and ``env_reward`` None, so ``nemo_gym_reward`` marks it unscorable.
    """
    env_masks = []
    for rollout in rollouts:
        mask = rollout.env_mask if rollout.ok else rollout.env_mask * 0
        env_masks.append(mask.tolist())
    return {
        "prompt_ids": [r.prompt_ids.tolist() for r in rollouts],
        "completion_ids": [r.completion_ids.tolist() for r in rollouts],
        "logprobs": [r.logprobs.tolist() for r in rollouts],
        "env_mask": env_masks,
        "env_reward": [r.reward if r.ok else None for r in rollouts],
        "num_turns": [r.num_turns for r in rollouts],
        "status": [str(r.status) for r in rollouts],
    }


def make_rollout_func(
    agents: Mapping[str, str] | ServerDirectory,
    rows: Iterable[TaskRow],
    *,
    default_agent: str | None = None,
    max_tokens_per_turn: int | None = None,
    on_drift: DriftPolicy | str = DriftPolicy.MARK,
    timeouts: Timeouts = Timeouts(),
    retry: RetryPolicy = RetryPolicy(),
    max_concurrency: int = 256,
    seed: int | None = None,
) -> NemoGymRolloutFunc:
    """A ``rollout_func`` for TRL's ``GRPOTrainer`` that plays rows through NeMo Gym agents.

    Example::

        rows = load_rows("train.jsonl")
        rollout_func = make_rollout_func(ServerDirectory.from_head("127.0.0.1:11000"), rows)
        trainer = GRPOTrainer(model, reward_funcs=[nemo_gym_reward], args=config,
                              train_dataset=make_dataset(rows), rollout_func=rollout_func)

    Args:
        agents: agent instance name -> URL, or a ``ServerDirectory``.
        rows: the rows the training dataset was built from (``make_dataset``); prompts
            name them by id.
        default_agent: agent for rows without ``agent_ref`` (default: the only agent).
        max_tokens_per_turn: ``max_output_tokens`` for every model call (default: the
            row's own). The whole completion is cut to the trainer's
            ``max_completion_length`` (tokens, mask and logprobs together).
        on_drift: what a turn whose prompt does not extend the history does: ``mark``
            (the rollout is unscorable) or ``raise``.
        timeouts: ``AgentClient``'s connect / per-request / whole-batch deadlines.
        retry: ``AgentClient``'s retry policy (connection errors, 429 and 5xx).
        max_concurrency: rollouts in flight at once (``AgentClient``).
        seed: seed of ``AgentClient``'s backoff jitter.

    Sampling parameters come from the trainer's ``GRPOConfig`` at the first call
    (:func:`sampling_from_args`), so the sampler samples what the learner corrects for.
    """
    return NemoGymRolloutFunc(
        agents,
        rows,
        default_agent=default_agent,
        max_tokens_per_turn=max_tokens_per_turn,
        on_drift=on_drift,
        timeouts=timeouts,
        retry=retry,
        max_concurrency=max_concurrency,
        seed=seed,
    )
