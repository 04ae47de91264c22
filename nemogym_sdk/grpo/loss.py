"""Which policy loss to compute: ``LossType``, ``ImportanceSampling`` and ``PolicyLoss``.

Pure attrs and enums (no torch), so configuration code (``nemogym_sdk.train.config``) can
name and check losses without loading torch; ``nemogym_sdk.adapters.torch`` computes them.
"""

from __future__ import annotations

import enum

import attrs

from nemogym_sdk.errors import ConfigError
from nemogym_sdk.grpo.normalize import choice

__all__ = ["ImportanceSampling", "LossType", "PolicyLoss"]


class LossType(enum.StrEnum):
    """How the per-token terms become one loss (``docs/training.md`` has the formulas)."""

    GRPO = "grpo"
    """Mean over each row's policy tokens, then mean over rows."""
    DAPO = "dapo"
    """Sum over every policy token of the batch / number of policy tokens (the default)."""
    DR_GRPO = "dr_grpo"
    """Sum over every policy token / (rows * ``max_completion_length``)."""
    GSPO = "gspo"
    """One sequence-level ratio per row, clipped per row; mean over rows."""


class ImportanceSampling(enum.StrEnum):
    """The correction against the sampler's logprobs, ``w = exp(old - sampler)``."""

    TRUNCATE = "truncate"
    """Clamp ``w`` into ``[is_floor, is_cap]`` (TRL's ``token_truncate``)."""
    MASK = "mask"
    """Weight 0 where ``w`` leaves ``[is_floor, is_cap]`` (TRL's ``token_mask``)."""
    NONE = "none"
    """``w = 1``: no correction (the mismatch is still measured)."""


def _loss_type(value: LossType | str) -> LossType:
    return choice(LossType, value, "loss_type")


def _importance_sampling(value: ImportanceSampling | str) -> ImportanceSampling:
    return choice(ImportanceSampling, value, "importance_sampling")


@attrs.frozen(kw_only=True)
class PolicyLoss:
    """Which policy loss to compute and its knobs (TRL's names where they exist).

    ``loss_type`` and ``importance_sampling`` take the enum members or their plain strings
    (``PolicyLoss(loss_type="gspo")``); the fields hold the members.
    """

    loss_type: LossType = attrs.field(default=LossType.DAPO, converter=_loss_type)
    """``grpo`` (per-row mean), ``dapo`` (token mean), ``dr_grpo`` (constant normaliser) or
    ``gspo`` (sequence-level ratio; use small epsilons, e.g. 3e-4 / 4e-4)."""
    epsilon: float = 0.2
    """Lower clipping range: ratios below ``1 - epsilon`` are clipped."""
    epsilon_high: float | None = None
    """Upper clipping range (DAPO's clip-higher, e.g. 0.28); None = ``epsilon``."""
    importance_sampling: ImportanceSampling = attrs.field(
        default=ImportanceSampling.TRUNCATE, converter=_importance_sampling
    )
    """Correction against the sampling logprobs: ``truncate`` the weight into ``[is_floor,
    is_cap]``, ``mask`` tokens whose weight leaves it, or ``none``."""
    is_cap: float = 3.0
    """Largest importance weight kept (TRL's ``vllm_importance_sampling_clip_max``)."""
    is_floor: float | None = None
    """Smallest importance weight kept (TRL's ``vllm_importance_sampling_clip_min``): under
    ``truncate`` smaller weights are raised to it, under ``mask`` they are masked; None =
    no floor. Must be below ``is_cap``."""
    beta: float = 0.0
    """KL penalty coefficient to a reference model (0: no reference needed)."""
    max_completion_length: int | None = None
    """``dr_grpo``'s constant (set it to the sampler's limit, as Dr. GRPO does); None = the
    batch's policy span: the longest completion in the loss, up to its last policy token."""
    mask_truncated: bool = False
    """Leave completions cut at ``max_completion_length`` out of the loss (DAPO's overlong
    filtering)."""

    def __attrs_post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise ``ConfigError`` for an out-of-range knob (unknown names fail earlier)."""
        if not 0 <= self.epsilon < 1 or (self.epsilon_high is not None and self.epsilon_high < 0):
            raise ConfigError(
                f"need 0 <= epsilon < 1 and epsilon_high >= 0, got {self.epsilon}, "
                f"{self.epsilon_high}"
            )
        if not self.is_cap > 0:
            raise ConfigError(f"need is_cap > 0, got {self.is_cap}")
        if self.is_floor is not None and not 0 <= self.is_floor < self.is_cap:
            raise ConfigError(
                f"need 0 <= is_floor < is_cap, got is_floor {self.is_floor} and is_cap "
                f"{self.is_cap}"
            )
        if self.beta < 0:
            raise ConfigError(f"beta must be >= 0, got {self.beta}")
        if self.max_completion_length is not None and self.max_completion_length < 1:
            raise ConfigError(
                f"max_completion_length must be >= 1, got {self.max_completion_length}"
            )

    @property
    def upper(self) -> float:
        """``1 + epsilon_high`` (or ``1 + epsilon``)."""
        return 1.0 + (self.epsilon if self.epsilon_high is None else self.epsilon_high)

    @property
    def lower(self) -> float:
        """``1 - epsilon``."""
        return 1.0 - self.epsilon
