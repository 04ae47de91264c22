"""``RolloutEngine``: rollouts keep playing while the learner learns (asynchronous GRPO).

- ``engine``: ``RolloutEngine`` itself (on the client's event loop; the module doc says how
  pacing bounds staleness), loaded on first use (it brings the network client);
- ``options``: ``EngineOptions``, how it plays, one frozen record validated once;
- ``pacing``: the rules it paces by (``may_start``, ``is_due``, ``keeps_bound``), pure
  functions;
- ``groups``: what it hands out (``Group``, ``EngineStep``, ``Leftover``) and its errors
  (``EngineStalledError``, ``EngineClosedError``), pure records.

``options``, ``pacing`` and ``groups`` import only the SDK's core; ``engine`` adds the network
client.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from nemogym_sdk.rollout_engine.groups import (
    EngineClosedError,
    EngineStalledError,
    EngineStep,
    Group,
    Leftover,
)
from nemogym_sdk.rollout_engine.options import EngineOptions
from nemogym_sdk.rollout_engine.pacing import is_due, keeps_bound, may_start

if TYPE_CHECKING:
    from nemogym_sdk.rollout_engine.engine import RolloutEngine


def __getattr__(name: str) -> Any:
    if name == "RolloutEngine":  # the network client loads with it, on first use
        from nemogym_sdk.rollout_engine.engine import RolloutEngine

        return RolloutEngine
    raise AttributeError(f"module 'nemogym_sdk.rollout_engine' has no attribute {name!r}")


__all__ = [
    "EngineClosedError",
    "EngineOptions",
    "EngineStalledError",
    "EngineStep",
    "Group",
    "Leftover",
    "RolloutEngine",
    "is_due",
    "keeps_bound",
    "may_start",
]
