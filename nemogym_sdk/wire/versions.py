"""The policy version of a model turn, carried where NeMo Gym keeps per-turn token data.

NeMo Gym's model server asks the sampler for one fixed model name every turn, so the
request cannot say which adapter version answered. The answer can: the sampler
(``nemogym_sdk.serve``, alone or in front of vLLM) sets the assistant message's
``routed_experts`` to an opaque string envelope, ``"nemogym-sdk:policy-version:<n>"``.

NeMo Gym 0.7.0 types ``routed_experts`` as per-token routing data *or an opaque string
envelope produced by the training framework* that it never inspects
(``nemo_gym.openai_utils.RoutedExperts``). It keeps the field in the turn's token bundle on
the output item of the ``/run`` result, and sends it back on that assistant message in
every later request of the episode. So the rollout learns, per turn, the version that
generated it, and the sampler learns which version an episode started on (pinning).

A turn without our envelope (another backend, or a MoE backend's real routing data) has
no version: None, never a guess.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "CARD_MAX_NUM_SEQS_FIELD",
    "CARD_VERSIONS_FIELD",
    "CARD_VERSIONS_KEPT_FIELD",
    "LOAD_VERSION_FIELD",
    "POLICY_VERSION_PREFIX",
    "policy_version_envelope",
    "read_policy_version",
]

POLICY_VERSION_PREFIX = "nemogym-sdk:policy-version:"
"""How the envelope starts; the version's decimal digits follow."""

LOAD_VERSION_FIELD = "policy_version"
"""The key ``LoraSync`` adds to a ``POST /v1/load_lora_adapter`` body: the version being
loaded. ``nemogym_sdk.serve`` records it; vLLM ignores keys it does not know."""

CARD_VERSIONS_FIELD = "policy_versions"
"""On a ``GET /v1/models`` card of ``nemogym_sdk.serve``: the versions of that adapter
loaded now, oldest first."""

CARD_VERSIONS_KEPT_FIELD = "policy_versions_kept"
"""On the same card: how many versions the server keeps loaded side by side."""

CARD_MAX_NUM_SEQS_FIELD = "max_num_seqs"
"""On the base model's ``GET /v1/models`` card of ``nemogym_sdk.serve``: how many
generations it decodes at once (its ``--max-num-seqs``); in front of replicas, their sum.
Absent or null where the server does not say (vLLM's cards do not)."""


def policy_version_envelope(version: int) -> str:
    """The ``routed_experts`` value that says "policy version ``version`` generated this"."""
    if isinstance(version, bool) or not isinstance(version, int) or version < 0:
        raise ValueError(f"a policy version is an int >= 0, got {version!r}")
    return f"{POLICY_VERSION_PREFIX}{version}"


def read_policy_version(value: Any) -> int | None:
    """The version in a ``routed_experts`` value, or None when it is not our envelope."""
    if not isinstance(value, str) or not value.startswith(POLICY_VERSION_PREFIX):
        return None
    digits = value[len(POLICY_VERSION_PREFIX) :]
    if not digits.isascii() or not digits.isdigit():
        return None
    return int(digits)
