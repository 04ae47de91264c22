"""NeMo Gym's JSON wire format: the only package that spells its field names.

No other module of the SDK writes a NeMo Gym JSON name as a string; they import it from
here. What lives where:

- ``names``: the names themselves: server types (``AGENTS``, ``RESOURCES`` ..., shared by
  ``directory`` and ``gym``), routes, the fields of ``/run`` results, rows, model server
  blocks and the head server's entries;
- ``run``: ``decode_run_result``, an agent's ``/run`` result (raw JSON bytes or a dict) as
  a ``RunResult`` with every turn's token arrays as native buffers (the parser's hot path);
- ``rows``: dataset rows (``agent_ref``, ``resources_server_ref``,
  ``responses_create_params`` and its sampling keys, tools, the prompt's messages) and the
  ``/run`` request body;
- ``responses``: the Responses-API ``response`` built from a completion for ``/verify``,
  its request body, and ``/verify`` answers (``decode_verify_result``, with the same
  reward and ``reward_components`` rules as ``/run`` results);
- ``head``: the head server's ``/server_instances`` entries;
- ``versions``: the policy version of a model turn, in the ``routed_experts`` envelope
  the SDK's sampler writes and its parser reads;
- ``affinity``: a group's affinity key, from the row to the router in front of the
  sampler replicas (``metadata.extra_body``, ``session_params``, ``x-session-id``).

Decoding never raises on malformed input: problems are reported in the returned record.
"""

from __future__ import annotations

from nemogym_sdk.wire.affinity import (
    ABORT_EPISODE_ROUTE,
    EPISODE_ID,
    EPISODE_ID_PARAM,
    ROUTER_FINISH_SESSION,
    ROUTER_SESSION_HEADER,
    SAMPLING_SEED,
    SESSION_ID,
    affinity_key,
    episode_of,
    with_affinity,
    with_episode,
    with_seed,
)
from nemogym_sdk.wire.head import ServerInstance, decode_server_instance, encode_server_instance
from nemogym_sdk.wire.names import (
    AGENT_REF,
    AGENTS,
    CONFIG_PATH,
    CONTENT,
    ENVIRONMENT_SERVERS,
    ERROR,
    FUNCTION_CALL,
    GENERATION_LOG_PROBS,
    GENERATION_TOKEN_IDS,
    HOST,
    INPUT,
    ITEM_TYPE,
    MASK_SAMPLE,
    MAX_OUTPUT_TOKENS,
    MESSAGE,
    MODEL_NAME_KEYS,
    MODELS,
    NAME,
    OUTPUT,
    OUTPUT_TEXT,
    PORT,
    PROCESS_NAME,
    PROMPT_TOKEN_IDS,
    RESOURCES,
    RESOURCES_SERVER,
    RESOURCES_SERVER_REF,
    RESPONSE,
    RESPONSES_CREATE_PARAMS,
    REWARD,
    REWARD_COMPONENTS,
    ROLE,
    ROUTED_EXPERTS,
    RUN_ROUTE,
    SEED_SESSION_ROUTE,
    SERVER_TYPE,
    SERVER_TYPES,
    TEMPERATURE,
    TEXT,
    TOOLS,
    TOP_P,
    VERIFY_ROUTE,
)
from nemogym_sdk.wire.responses import (
    VerifyAnswer,
    build_response,
    build_verify_body,
    decode_verify_result,
)
from nemogym_sdk.wire.rows import (
    agent_name,
    build_run_body,
    create_params,
    input_messages,
    resources_server_name,
    row_tools,
    sampling_overrides,
)
from nemogym_sdk.wire.run import (
    ModelTurn,
    RunResult,
    decode_run_result,
    finite_components,
    finite_reward,
)
from nemogym_sdk.wire.versions import (
    CARD_MAX_NUM_SEQS_FIELD,
    CARD_VERSIONS_FIELD,
    CARD_VERSIONS_KEPT_FIELD,
    LOAD_VERSION_FIELD,
    POLICY_VERSION_PREFIX,
    policy_version_envelope,
    read_policy_version,
)

__all__ = [
    "ABORT_EPISODE_ROUTE",
    "AGENTS",
    "AGENT_REF",
    "CARD_MAX_NUM_SEQS_FIELD",
    "CARD_VERSIONS_FIELD",
    "CARD_VERSIONS_KEPT_FIELD",
    "CONFIG_PATH",
    "CONTENT",
    "ENVIRONMENT_SERVERS",
    "EPISODE_ID",
    "EPISODE_ID_PARAM",
    "ERROR",
    "FUNCTION_CALL",
    "GENERATION_LOG_PROBS",
    "GENERATION_TOKEN_IDS",
    "HOST",
    "INPUT",
    "ITEM_TYPE",
    "LOAD_VERSION_FIELD",
    "MASK_SAMPLE",
    "MAX_OUTPUT_TOKENS",
    "MESSAGE",
    "MODELS",
    "MODEL_NAME_KEYS",
    "NAME",
    "OUTPUT",
    "OUTPUT_TEXT",
    "POLICY_VERSION_PREFIX",
    "PORT",
    "PROCESS_NAME",
    "PROMPT_TOKEN_IDS",
    "RESOURCES",
    "RESOURCES_SERVER",
    "RESOURCES_SERVER_REF",
    "RESPONSE",
    "RESPONSES_CREATE_PARAMS",
    "REWARD",
    "REWARD_COMPONENTS",
    "ROLE",
    "ROUTED_EXPERTS",
    "ROUTER_FINISH_SESSION",
    "ROUTER_SESSION_HEADER",
    "SAMPLING_SEED",
    "SESSION_ID",
    "RUN_ROUTE",
    "SEED_SESSION_ROUTE",
    "SERVER_TYPE",
    "SERVER_TYPES",
    "TEMPERATURE",
    "TEXT",
    "TOOLS",
    "TOP_P",
    "VERIFY_ROUTE",
    "ModelTurn",
    "RunResult",
    "ServerInstance",
    "VerifyAnswer",
    "affinity_key",
    "episode_of",
    "agent_name",
    "build_response",
    "build_run_body",
    "build_verify_body",
    "create_params",
    "decode_run_result",
    "decode_server_instance",
    "decode_verify_result",
    "encode_server_instance",
    "finite_components",
    "finite_reward",
    "input_messages",
    "policy_version_envelope",
    "read_policy_version",
    "resources_server_name",
    "row_tools",
    "sampling_overrides",
    "with_affinity",
    "with_episode",
    "with_seed",
]
