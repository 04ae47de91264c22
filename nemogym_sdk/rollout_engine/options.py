"""``EngineOptions``: how a ``RolloutEngine`` plays, one frozen record validated once.

The trainer (``TrainConfig.engine_options``), the axolotl producer (``Pacing.engine``) and
users' own loops build this record; the engine reads it. A bad value raises ``ConfigError``
when the record is made, naming the value received, before anything starts.
"""

from __future__ import annotations

import attrs

from nemogym_sdk.errors import ConfigError
from nemogym_sdk.records import ParseOptions

__all__ = ["EngineOptions"]


@attrs.frozen(kw_only=True)
class EngineOptions:
    """How a ``RolloutEngine`` plays (see ``nemogym_sdk.rollout_engine.engine``)."""

    num_generations: int
    """Rollouts per group."""
    groups_per_step: int
    """Groups ``next_step`` hands out."""
    max_staleness: int = 0
    """Versions a group may be trained behind the one it started on (0: synchronous)."""
    max_inflight: int | None = None
    """Episodes playing at once (None: every episode the pacing allows, `inflight`)."""
    episode_timeout: float | None = None
    """Seconds an episode may play before it ends as ``TIMEOUT`` (None: no deadline)."""
    cut_stragglers: bool = False
    """Hand out a due group as soon as two of its episodes are ``OK``; the ones still
    playing are cancelled and come out as ``TIMEOUT`` failures (a slow episode never holds
    the learner, at the price of favouring fast episodes within a group). Off: a due group
    waits for its episodes' deadlines."""
    parse: ParseOptions = attrs.field(factory=ParseOptions)
    """How ``/run`` results become rollouts."""
    seed: int | None = None
    """Episode ``i`` of group ``n`` samples with ``data.rollout_seed(seed, n, i)``, so a
    group played again (a resumed run) draws what it drew before; None: the sampler draws
    its own."""

    def __attrs_post_init__(self) -> None:
        for name in ("num_generations", "groups_per_step"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name} must be an integer >= 1, got {value!r}")
        if isinstance(self.max_staleness, bool) or not isinstance(self.max_staleness, int):
            raise ConfigError(f"max_staleness must be an integer >= 0, got {self.max_staleness!r}")
        if self.max_staleness < 0:
            raise ConfigError(f"max_staleness must be >= 0, got {self.max_staleness}")
        if self.max_inflight is not None and self.max_inflight < self.num_generations:
            raise ConfigError(
                f"max_inflight={self.max_inflight} cannot hold one group of "
                f"num_generations={self.num_generations} episodes: the engine starts whole groups"
            )
        seed = self.seed
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise ConfigError(f"seed must be an integer or None, got {seed!r}")
        if self.episode_timeout is not None and not self.episode_timeout > 0:
            raise ConfigError(f"episode_timeout must be > 0 seconds, got {self.episode_timeout}")

    @property
    def inflight(self) -> int:
        """Episodes playing at once: ``max_inflight``, or all the pacing allows,
        ``(max_staleness + 1) * groups_per_step * num_generations``."""
        if self.max_inflight is not None:
            return self.max_inflight
        return (self.max_staleness + 1) * self.groups_per_step * self.num_generations
