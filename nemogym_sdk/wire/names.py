"""NeMo Gym's JSON names: server types, routes and field names (spelled only here)."""

from __future__ import annotations

# Server types: the second-level keys of NeMo Gym's global config, also reported as
# ``server_type`` by the head server's ``/server_instances``.
AGENTS = "responses_api_agents"
RESOURCES = "resources_servers"
MODELS = "responses_api_models"
ENVIRONMENT_SERVERS = "environment_servers"
SERVER_TYPES = (AGENTS, RESOURCES, MODELS, ENVIRONMENT_SERVERS)

# Routes.
RUN_ROUTE = "/run"
SEED_SESSION_ROUTE = "/seed_session"
VERIFY_ROUTE = "/verify"

# Field names of NeMo Gym's /run result.
RESPONSE = "response"
OUTPUT = "output"
REWARD = "reward"
ERROR = "error"
MASK_SAMPLE = "mask_sample"
REWARD_COMPONENTS = "reward_components"
PROMPT_TOKEN_IDS = "prompt_token_ids"
GENERATION_TOKEN_IDS = "generation_token_ids"
GENERATION_LOG_PROBS = "generation_log_probs"
ROUTED_EXPERTS = "routed_experts"
ITEM_TYPE = "type"
FUNCTION_CALL = "function_call"
MESSAGE = "message"
CONTENT = "content"
OUTPUT_TEXT = "output_text"
TEXT = "text"

# NeMo Gym's rollout collection writes a failure row, not a /run result, for a rollout that
# produced none: a failed /run under ``route_failures_to_sidecar``, a row its dispatch budget
# never started, an environment server's handled failure.
NG_FAILURE_CLASS = "_ng_failure_class"
NG_FAILURE_MESSAGE = "_ng_failure_message"
NG_FAILURE_TYPE = "_ng_failure_type"
NG_FAILURE_HTTP_STATUS = "_ng_failure_http_status"
NG_FAILURE_BODY = "_ng_failure_response_body"
NG_FAILURE_STAGE = "_ng_failure_stage"
NG_FAILURE_TERMINAL = "_ng_failure_terminal"
NG_ERROR_MESSAGE = "error_message"
"""The reason on a row the dispatch budget never started (``_ng_failure_class: cancelled``)."""
NG_TRANSPORT_FAILURES = frozenset(
    {
        "agent_request_failed",
        "transport_unreachable",
        "transport_peer_drop",
        "transport_local_resource",
    }
)
"""Failure classes (NeMo Gym's ``failure_kinds``) where the rollout may never have run: no
answer, or a gateway status in front of the agent."""
NG_TIMEOUT_FAILURES = frozenset({"cancelled", "agent_timeout", "transport_timeout"})
"""Failure classes of a deadline or a dispatch budget; every other class (``agent_run_error``,
``environment_server_failed``, the judge's, the sandbox provider's ...) is the episode's own."""

# Fields of a dataset row and of its request.
RESPONSES_CREATE_PARAMS = "responses_create_params"
AGENT_REF = "agent_ref"
RESOURCES_SERVER_REF = "resources_server_ref"
"""A row's own choice of the resources server that scores it (``{"name": ...}``)."""
NAME = "name"
TOOLS = "tools"
TEMPERATURE = "temperature"
TOP_P = "top_p"
MAX_OUTPUT_TOKENS = "max_output_tokens"
INPUT = "input"
ROLE = "role"

# Server config blocks.
RESOURCES_SERVER = "resources_server"
"""An agent config's reference to its resources server (``{"type": ..., "name": ...}``)."""
MODEL_NAME_KEYS = (("model", "base_url"), ("openai_model", "openai_base_url"))
"""(model name key, backend URL key) of NeMo Gym's model server implementations: what a
``vllm_model`` (or ``openai_model``) block requests, and from where."""

# The head server's /server_instances entries.
PROCESS_NAME = "process_name"
CONFIG_PATH = "config_path"
HOST = "host"
PORT = "port"
SERVER_TYPE = "server_type"
