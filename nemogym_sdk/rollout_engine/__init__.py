"""``RolloutEngine``: rollouts keep playing while the learner learns (asynchronous GRPO).

- ``engine``: ``RolloutEngine`` itself (on the client's event loop; the module doc says how
  pacing bounds staleness);
- ``pacing``: the rules it paces by (``may_start``, ``is_due``), pure functions;
- ``groups``: what it hands out (``Group``, ``EngineStep``, ``Leftover``) and its errors
  (``EngineStalledError``, ``EngineClosedError``), pure records.

``pacing`` and ``groups`` import only the SDK's core; ``engine`` adds the network client.
"""

from __future__ import annotations

from nemogym_sdk.rollout_engine.engine import RolloutEngine
from nemogym_sdk.rollout_engine.groups import (
    EngineClosedError,
    EngineStalledError,
    EngineStep,
    Group,
    Leftover,
)
from nemogym_sdk.rollout_engine.pacing import is_due, may_start

__all__ = [
    "EngineClosedError",
    "EngineStalledError",
    "EngineStep",
    "Group",
    "Leftover",
    "RolloutEngine",
    "is_due",
    "may_start",
]
