"""A group's affinity key, from the row NeMo Gym plays to the router in front of the samplers.

All rollouts of a GRPO group share their prompt; sent to one sampler replica, they share
its prefix cache, and the groups spread over the replicas. ``vllm-router`` keeps requests
with one key on one replica (``--policy consistent_hash``): the key is the request's
``x-session-id`` header or, on a chat request, ``session_params.session_id`` in its body.

NeMo Gym carries no header from a ``/run`` to the model server's backend request, but its
``vllm_model`` merges the JSON object in ``responses_create_params.metadata.extra_body`` (a
string, as OpenAI's metadata values are) into the body of every chat request of the
episode. So ``with_affinity`` puts ``{"session_params": {"session_id": <key>}}`` there;
``nemogym_sdk.serve`` reads it back (``affinity_key``) and sends it as the header, since it
generates through the router's completions route, where only the header counts. A router
directly behind NeMo Gym reads it from the chat body itself.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from nemogym_sdk.wire.names import RESPONSES_CREATE_PARAMS

__all__ = [
    "ABORT_EPISODE_ROUTE",
    "EPISODE_ID",
    "EPISODE_ID_PARAM",
    "EXTRA_BODY",
    "METADATA",
    "ROUTER_FINISH_SESSION",
    "ROUTER_SESSION_HEADER",
    "SESSION_ID",
    "SESSION_PARAMS",
    "affinity_key",
    "episode_of",
    "SAMPLING_SEED",
    "with_affinity",
    "with_episode",
    "with_seed",
]

METADATA = "metadata"
"""``responses_create_params.metadata``: string keys and string values (OpenAI's rule)."""
EXTRA_BODY = "extra_body"
"""The metadata key whose JSON object NeMo Gym's ``vllm_model`` merges into the backend body."""
SESSION_PARAMS = "session_params"
"""vllm-router's body object on a chat request that holds the affinity key."""
SESSION_ID = "session_id"
"""The key inside ``session_params``."""
ROUTER_SESSION_HEADER = "x-session-id"
"""vllm-router's affinity header (it wins over every body field)."""
EPISODE_ID = "nemogym_episode_id"
"""The SDK's own field of a chat request body (merged in from ``extra_body`` as the router's
key is): which episode the turn belongs to, so ``nemogym_sdk.serve`` can stop an episode
the client has given up on."""
SAMPLING_SEED = "seed"
"""A chat request's sampling seed (OpenAI's and vLLM's ``seed``), merged in from
``extra_body`` like the keys above: the seed of a rollout (``RolloutRequest.seed``)."""
ABORT_EPISODE_ROUTE = "/abort_episode"
"""``nemogym_sdk.serve``'s route (``POST /abort_episode?episode_id=<id>``): the client gave
up on the episode; its generation in flight stops and its later turns are refused."""
EPISODE_ID_PARAM = "episode_id"
"""The query parameter of ``ABORT_EPISODE_ROUTE``."""
ROUTER_FINISH_SESSION = "/finish_session"
"""vllm-router's route that forgets a key (``POST /finish_session?session_id=<key>``): under
``--policy sticky_least_loaded`` a key counts as an active session of its replica until it
is finished, so a run that never finishes its groups' keys grows the router's table and
skews its balance by groups long done."""


def with_affinity(row: Mapping[str, Any], key: str) -> dict[str, Any]:
    """A copy of ``row`` whose model requests carry the affinity ``key``.

    An ``extra_body`` the row already has keeps its other fields; the row is not mutated.
    """
    return _with_extra_body(row, lambda extra: _set_session(extra, key))


def with_episode(row: Mapping[str, Any], episode: str) -> dict[str, Any]:
    """A copy of ``row`` whose model requests carry the id ``episode`` (``EPISODE_ID``), the
    key the client aborts the episode by at ``nemogym_sdk.serve`` once it gives up on it."""
    return _with_extra_body(row, lambda extra: extra.__setitem__(EPISODE_ID, episode))


def with_seed(row: Mapping[str, Any], seed: int) -> dict[str, Any]:
    """A copy of ``row`` whose model requests carry the sampling ``seed``
    (``SAMPLING_SEED``): every turn of the episode gets the same one."""
    return _with_extra_body(row, lambda extra: extra.__setitem__(SAMPLING_SEED, seed))


def episode_of(body: Mapping[str, Any]) -> str | None:
    """The episode id of a chat request body (``EPISODE_ID``), if any."""
    episode = body.get(EPISODE_ID)
    return episode if isinstance(episode, str) and episode else None


def _set_session(extra: dict[str, Any], key: str) -> None:
    extra[SESSION_PARAMS] = {**(extra.get(SESSION_PARAMS) or {}), SESSION_ID: key}


def _with_extra_body(
    row: Mapping[str, Any], update: Callable[[dict[str, Any]], None]
) -> dict[str, Any]:
    """A copy of ``row`` whose ``metadata.extra_body`` object ``update`` changed in place."""
    params = dict(row.get(RESPONSES_CREATE_PARAMS) or {})
    metadata = dict(params.get(METADATA) or {})
    extra: Any = {}
    if isinstance(metadata.get(EXTRA_BODY), str):
        try:
            extra = json.loads(metadata[EXTRA_BODY])
        except ValueError:
            extra = {}
    if not isinstance(extra, dict):
        extra = {}
    update(extra)
    metadata[EXTRA_BODY] = json.dumps(extra, separators=(",", ":"))
    params[METADATA] = metadata
    return {**row, RESPONSES_CREATE_PARAMS: params}


def affinity_key(body: Mapping[str, Any]) -> str | None:
    """The affinity key of a chat request body (``session_params.session_id``), if any."""
    params = body.get(SESSION_PARAMS)
    key = params.get(SESSION_ID) if isinstance(params, Mapping) else None
    return key if isinstance(key, str) and key else None
