"""nemogym_sdk.testing: property tests for NeMo Gym parsers and trainer integrations.

Install with ``pip install nemogym-sdk[testing]`` (it brings Hypothesis). Nothing here is
imported by ``import nemogym_sdk``.

- Strategies with ground truth: ``episodes()`` (well-formed or drifting ``/run`` results,
  float or integer rewards, and the exact sample each must give), ``drifted_episodes()``,
  ``failures()`` (failure shapes and their ``RolloutStatus``), ``mangled_responses()``,
  ``json_values()``, ``raw_responses()``; ``rollouts()``, ``reward_groups()``,
  ``grouped_rollouts()`` for collation and GRPO code; ``templated_episodes(tokenizer)``
  (conversations a real chat template renders, drifting for its real reasons).
- Property checks for any ``response -> sample`` function: ``Parser``, ``check_all``,
  ``find_failures`` and the single checks in ``CHECKS`` (``nemogym_sdk.testing.checks``),
  each testing one property so that one failure cannot hide another;
  ``Parser.differences`` declares what a parser does differently on purpose.
- A fake NeMo Gym agent on loopback with a fault plan: ``fake_agent()``
  (``nemogym_sdk.testing.fake_agent``), and a pytest fixture: add
  ``pytest_plugins = ["nemogym_sdk.testing.pytest_plugin"]`` to a ``conftest.py``.
"""

from __future__ import annotations

try:
    import hypothesis  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the environment
    from nemogym_sdk import _extras

    raise ImportError(_extras.needs("nemogym_sdk.testing", ["hypothesis"], "testing")) from exc

from nemogym_sdk.testing.batches import (
    BINARY_OR_GRID,
    BINARY_OR_REWARDS,
    FAILED_STATUSES,
    GRID_REWARDS,
    RewardGroups,
    grouped_rollouts,
    reward_groups,
    rollouts,
    scored_rollout,
)
from nemogym_sdk.testing.checks import (
    CHECKS,
    check_all,
    check_drift_rejected,
    check_env_tokens_not_trained,
    check_failures_not_trained,
    check_logprob_count_mismatch_not_trained,
    check_logprobs,
    check_never_crashes,
    check_num_turns,
    check_policy_tokens_trained,
    check_reward,
    check_stitching,
    find_failures,
)
from nemogym_sdk.testing.episodes import (
    DRIFT_KINDS,
    JSON_REWARDS,
    LOGPROBS,
    REWARDS,
    TOKENS,
    Episode,
    drifted_episodes,
    episodes,
)
from nemogym_sdk.testing.fake_agent import FakeAgent, Fault, FaultScript, always, burst, fake_agent
from nemogym_sdk.testing.parsers import (
    Parser,
    PropertyCheckError,
    Sample,
    rollout_samples,
    sdk_parser,
    seed_dict_samples,
)
from nemogym_sdk.testing.responses import (
    FAILURE_KINDS,
    FailureCase,
    failures,
    json_values,
    mangled_responses,
    raw_responses,
)
from nemogym_sdk.testing.templated import templated_episodes

__all__ = [
    "BINARY_OR_GRID",
    "BINARY_OR_REWARDS",
    "CHECKS",
    "DRIFT_KINDS",
    "FAILED_STATUSES",
    "FAILURE_KINDS",
    "GRID_REWARDS",
    "JSON_REWARDS",
    "LOGPROBS",
    "REWARDS",
    "TOKENS",
    "Episode",
    "FailureCase",
    "FakeAgent",
    "Fault",
    "Parser",
    "PropertyCheckError",
    "RewardGroups",
    "Sample",
    "FaultScript",
    "always",
    "burst",
    "check_all",
    "check_drift_rejected",
    "check_env_tokens_not_trained",
    "check_failures_not_trained",
    "check_logprob_count_mismatch_not_trained",
    "check_logprobs",
    "check_never_crashes",
    "check_num_turns",
    "check_policy_tokens_trained",
    "check_reward",
    "check_stitching",
    "drifted_episodes",
    "episodes",
    "failures",
    "fake_agent",
    "find_failures",
    "grouped_rollouts",
    "json_values",
    "mangled_responses",
    "raw_responses",
    "reward_groups",
    "rollout_samples",
    "rollouts",
    "scored_rollout",
    "sdk_parser",
    "templated_episodes",
    "seed_dict_samples",
]
