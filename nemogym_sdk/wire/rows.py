"""Dataset rows and the ``/run`` request body: agent and resources-server references,
sampling keys, tools and the prompt's messages."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from nemogym_sdk.wire.names import (
    AGENT_REF,
    CONTENT,
    INPUT,
    ITEM_TYPE,
    MAX_OUTPUT_TOKENS,
    MESSAGE,
    NAME,
    OUTPUT_TEXT,
    RESOURCES_SERVER_REF,
    RESPONSES_CREATE_PARAMS,
    ROLE,
    TEMPERATURE,
    TEXT,
    TOOLS,
    TOP_P,
)

__all__ = [
    "agent_name",
    "build_run_body",
    "create_params",
    "input_messages",
    "resources_server_name",
    "row_tools",
    "sampling_overrides",
]


def agent_name(row: Mapping[str, Any]) -> str | None:
    """``agent_ref.name`` of a row, when it names an agent."""
    ref = row.get(AGENT_REF)
    name = ref.get(NAME) if isinstance(ref, Mapping) else None
    return name if isinstance(name, str) and name else None


def resources_server_name(row: Mapping[str, Any]) -> str | None:
    """``resources_server_ref.name`` of a row, when it names the server that scores it."""
    ref = row.get(RESOURCES_SERVER_REF)
    name = ref.get(NAME) if isinstance(ref, Mapping) else None
    return name if isinstance(name, str) and name else None


def create_params(row: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """A row's ``responses_create_params`` object, or None when it has none."""
    params = row.get(RESPONSES_CREATE_PARAMS)
    return params if isinstance(params, Mapping) else None


def row_tools(row: Mapping[str, Any]) -> list[Any]:
    """The tools a row offers the model (``responses_create_params.tools``), or ``[]``."""
    params = create_params(row)
    tools = params.get(TOOLS) if params is not None else None
    return list(tools) if isinstance(tools, Sequence) and not isinstance(tools, str) else []


def sampling_overrides(
    temperature: float | None, top_p: float | None, max_output_tokens: int | None
) -> dict[str, float | int | None]:
    """Sampling parameters as ``responses_create_params`` keys (None: keep the row's)."""
    return {TEMPERATURE: temperature, TOP_P: top_p, MAX_OUTPUT_TOKENS: max_output_tokens}


def build_run_body(
    row: Mapping[str, Any], overrides: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The ``/run`` request body for a dataset row.

    The row is sent whole (``agent_ref``, task fields, every message of the prompt,
    tools, metadata), with ``responses_create_params`` copied, not mutated. Precedence
    inside ``responses_create_params``: a non-None value in ``overrides`` (the trainer's
    sampling parameters) wins over the row's value; a None override leaves the row's
    value alone; and keys whose value is None are dropped, so a ``None`` left by a data
    loader is never sent as a value.
    """
    body = dict(row)
    params = row.get(RESPONSES_CREATE_PARAMS)
    merged = {k: v for k, v in (params or {}).items() if v is not None}
    for key, value in (overrides or {}).items():
        if value is not None:
            merged[key] = value
    body[RESPONSES_CREATE_PARAMS] = merged
    return body


_TEXT_PARTS = frozenset({"input_text", OUTPUT_TEXT, TEXT})


def input_messages(row: Mapping[str, Any]) -> list[dict[str, str]]:
    """A row's request input as chat messages ``{"role", "content"}`` with text content.

    ``responses_create_params.input`` is a string (one user message) or a list of items;
    message items keep their role, and their content, a string or a list of parts, becomes
    the text of its text parts. Items that are not messages (earlier tool calls and their
    outputs) are left out: this is the prompt as a trainer shows or samples it, while the
    row itself still travels whole to the agent.
    """
    params = create_params(row)
    raw = params.get(INPUT) if params is not None else None
    if isinstance(raw, str):
        return [{ROLE: "user", CONTENT: raw}]
    messages = []
    for item in raw if isinstance(raw, Sequence) else ():
        if not isinstance(item, Mapping) or not isinstance(item.get(ROLE), str):
            continue
        if item.get(ITEM_TYPE, MESSAGE) != MESSAGE:
            continue
        content = item.get(CONTENT)
        if isinstance(content, str):
            text = content
        elif isinstance(content, Sequence):
            text = "".join(
                str(part.get(TEXT, ""))
                for part in content
                if isinstance(part, Mapping) and part.get(ITEM_TYPE) in _TEXT_PARTS
            )
        else:
            text = ""
        messages.append({ROLE: item[ROLE], CONTENT: text})
    return messages
