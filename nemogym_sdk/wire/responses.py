"""Responses-API objects for ``/verify``: the ``response`` built from a completion, the
request body, and the decoded answer."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from nemogym_sdk.wire.names import MASK_SAMPLE, RESPONSE, REWARD, REWARD_COMPONENTS
from nemogym_sdk.wire.run import finite_components, finite_reward

__all__ = ["VerifyAnswer", "build_response", "build_verify_body", "decode_verify_result"]


_THINK = re.compile(r"^\s*<think>(.*?)</think>\s*", re.DOTALL)


def _message_items(text: str, index: int) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    think = _THINK.match(text)
    if think:
        summary = [{"type": "summary_text", "text": think.group(1).strip()}]
        items.append({"id": f"rs_{index}", "type": "reasoning", "summary": summary})
        text = text[think.end() :]
    if text:
        content = [{"type": "output_text", "text": text, "annotations": []}]
        items.append(
            {
                "id": f"msg_{index}",
                "type": "message",
                "role": "assistant",
                "status": "completed",
                "content": content,
            }
        )
    return items


def _chat_items(message: Mapping[str, Any], index: int) -> list[dict[str, Any]]:
    """Responses output items for one chat message of a completion."""
    role = message.get("role", "assistant")
    if role == "tool":
        output = message.get("content")
        return [
            {
                "type": "function_call_output",
                "call_id": str(message.get("tool_call_id", f"call_{index}")),
                "output": output if isinstance(output, str) else json.dumps(output),
            }
        ]
    items: list[dict[str, Any]] = []
    reasoning = message.get("reasoning_content") or message.get("reasoning")
    if isinstance(reasoning, str) and reasoning:
        summary = [{"type": "summary_text", "text": reasoning}]
        items.append({"id": f"rs_{index}", "type": "reasoning", "summary": summary})
    content = message.get("content")
    if isinstance(content, list):  # content parts
        content = "".join(str(p.get("text", "")) for p in content if isinstance(p, Mapping))
    if isinstance(content, str) and content:
        items += _message_items(content, index)
    for n, call in enumerate(message.get("tool_calls") or []):
        function = call.get("function", call) if isinstance(call, Mapping) else {}
        arguments = function.get("arguments", "{}")
        call_id = str(call.get("id") or f"call_{index}_{n}")
        items.append(
            {
                "type": "function_call",
                "id": call_id,
                "call_id": call_id,
                "name": str(function.get("name", "")),
                "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments),
                "status": "completed",
            }
        )
    return items


def build_response(
    completion: str | Sequence[Mapping[str, Any]],
    *,
    model: str,
    tools: Sequence[Any] = (),
) -> dict[str, Any]:
    """A well-formed Responses-API ``response`` object holding ``completion``.

    ``completion`` may be plain text (a leading ``<think>...</think>`` becomes a
    reasoning item), chat messages (assistant text, ``reasoning_content``,
    ``tool_calls``; ``tool`` messages become function call outputs), or Responses output
    items (dicts with a ``type``), which are used as they are.
    """
    output: list[dict[str, Any]] = []
    if isinstance(completion, str):
        output = _message_items(completion, 0)
    else:
        for index, part in enumerate(completion):
            if "type" in part and "role" not in part:
                output.append(dict(part))
            else:
                output += _chat_items(part, index)
    if not output:  # an empty answer is still a (blank) message
        output = [
            {
                "id": "msg_0",
                "type": "message",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": "", "annotations": []}],
            }
        ]
    return {
        "id": "resp_nemogym_sdk",
        "object": "response",
        "created_at": 0,
        "model": model,
        "status": "completed",
        "output": output,
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": list(tools),
    }


def build_verify_body(row: Mapping[str, Any], response: Mapping[str, Any]) -> dict[str, Any]:
    """The ``/verify`` body: the row (``responses_create_params`` with its tools, system
    prompt and metadata untouched) plus the ``response`` to score."""
    body = {k: v for k, v in row.items() if v is not None}
    body[RESPONSE] = dict(response)
    return body


# --- /verify answers ----------------------------------------------------------------------


class VerifyAnswer(NamedTuple):
    """A decoded ``/verify`` answer."""

    invalid: str | None = None
    """Why the answer cannot be used (not JSON, no finite numeric reward), or None."""
    reward: float | None = None
    """``reward``; None when the answer is invalid."""
    reward_components: dict[str, float] = {}  # noqa: RUF012 - never mutated
    """Finite numeric entries of ``reward_components`` (as in ``/run`` results)."""
    mask_sample: bool = False
    """The environment asked to leave the sample out."""
    data: Any = None
    """The whole decoded answer."""


def decode_verify_result(body: bytes | str) -> VerifyAnswer:
    """Decode a ``/verify`` answer; never raises (problems are in ``invalid``).

    The reward must be a finite number (not a bool); ``reward_components`` keeps its
    finite numeric entries and drops the rest, exactly as ``decode_run_result`` does.
    """
    try:
        data = json.loads(body)
    except ValueError:
        preview = body[:100]
        return VerifyAnswer(invalid=f"/verify returned non-JSON {preview!r}")
    if not isinstance(data, dict):
        return VerifyAnswer(invalid="/verify returned no numeric reward", data=data)
    reward = finite_reward(data.get(REWARD))
    if reward is None:
        return VerifyAnswer(invalid="/verify returned no numeric reward", data=data)
    return VerifyAnswer(
        reward=reward,
        reward_components=finite_components(data.get(REWARD_COMPONENTS)),
        mask_sample=data.get(MASK_SAMPLE) is True,
        data=data,
    )
