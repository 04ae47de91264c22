"""Reward functions with the signature TRL and axolotl call: ``f(completions, prompts, **kw)``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["reward_env"]


def reward_env(
    completions: Sequence[Any], prompts: Sequence[Any] | None = None, **kwargs: Any
) -> list[float]:
    """Pass the environment's reward through as the reward of each completion.

    Reads ``env_reward`` (which a rollout function puts into each input row): a list
    gives one reward per completion, a scalar is repeated for every completion, and a
    missing ``env_reward`` gives zeros.
    """
    rewards = kwargs.get("env_reward")
    if rewards is None:
        return [0.0] * len(completions)
    if isinstance(rewards, (str, bytes)):
        raise TypeError(f"env_reward must be a number or a sequence of numbers, got {rewards!r}")
    if isinstance(rewards, Sequence) or hasattr(rewards, "__len__"):
        values = [float(r) for r in rewards]
        if len(values) != len(completions):
            raise ValueError(
                f"env_reward has {len(values)} values for {len(completions)} completions"
            )
        return values
    return [float(rewards)] * len(completions)
