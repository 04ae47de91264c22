"""The OpenAI/vLLM wire format: parse chat and tokenize requests, build vLLM-shaped responses.

Shapes follow vLLM 0.32's OpenAI-compatible server (``/v1/chat/completions``,
``/v1/completions``, ``/tokenize``, ``/v1/models``) and what NeMo Gym's ``vllm_model`` reads
from them: ``prompt_token_ids`` and ``generation_token_ids`` of every turn, and each generated
token's logprob, its token written ``token_id:<id>`` when asked with
``return_tokens_as_token_ids``. Pure Python: no torch, so request validation is
unit-testable and cheap.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import attrs

from nemogym_sdk.serve.errors import BadRequestError
from nemogym_sdk.serve.tools import ToolCall

__all__ = [
    "ChatRequest",
    "FinishReason",
    "RequestSampling",
    "TokenizeRequest",
    "TokenLogprob",
    "chat_completion_body",
    "logprob_entry",
    "model_card",
    "usage_body",
]

FinishReason = Literal["stop", "length", "tool_calls"]
_MAX_TOP_LOGPROBS = 20


def _opt_number(body: Mapping[str, Any], key: str, default: float) -> float:
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BadRequestError(f"'{key}' must be a number.", param=key)
    return float(value)


def _opt_int(body: Mapping[str, Any], key: str) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequestError(f"'{key}' must be an integer.", param=key)
    return value


def _flag(body: Mapping[str, Any], key: str, default: bool) -> bool:
    value = body.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise BadRequestError(f"'{key}' must be a boolean.", param=key)
    return value


def _messages(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequestError("'messages' must be a non-empty list.", param="messages")
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise BadRequestError(f"messages[{index}] must be an object with a 'role'.")
    return messages


def _tools(body: Mapping[str, Any]) -> list[dict[str, Any]] | None:
    tools = body.get("tools")
    if tools is None:
        return None
    if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
        raise BadRequestError("'tools' must be a list of objects.", param="tools")
    return tools or None


def _kwargs(body: Mapping[str, Any], key: str) -> dict[str, Any]:
    value = body.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise BadRequestError(f"'{key}' must be an object.", param=key)
    return value


@attrs.frozen(kw_only=True)
class RequestSampling:
    """How the server picks tokens for one chat request (vLLM semantics; which logprobs are
    reported is the server's mode).

    The model server's side of sampling, parsed from a request body. The trainer's side,
    what ``AgentClient`` forces onto every row and the learner corrects for, is
    ``nemogym_sdk.SamplingParams``.
    """

    max_tokens: int | None = None
    """Most tokens to generate; ``None`` = the rest of the context window."""
    temperature: float = 1.0
    """0 means greedy."""
    top_p: float = 1.0
    """Nucleus sampling mass."""
    top_k: int = 0
    """Keep the k most likely tokens; 0 or -1 = off."""
    seed: int | None = None
    """Per-request sampling seed; ``None`` draws one from the server's seeded generator."""
    stop: tuple[str, ...] = ()
    """Stop strings (excluded from the returned text)."""
    stop_token_ids: tuple[int, ...] = ()
    """Extra token ids that end generation."""
    ignore_eos: bool = False
    """Keep generating past EOS."""

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> RequestSampling:
        """Parse the sampling fields of a chat completion request body."""
        max_tokens = _opt_int(body, "max_completion_tokens")
        if max_tokens is None:
            max_tokens = _opt_int(body, "max_tokens")
        if max_tokens is not None and max_tokens < 1:
            raise BadRequestError(
                f"max_tokens must be at least 1, got {max_tokens}.", param="max_tokens"
            )
        temperature = _opt_number(body, "temperature", 1.0)
        top_p = _opt_number(body, "top_p", 1.0)
        if temperature < 0:
            raise BadRequestError("temperature must be non-negative.", param="temperature")
        if not 0 < top_p <= 1:
            raise BadRequestError("top_p must be in (0, 1].", param="top_p")
        stop = body.get("stop")
        stops = (stop,) if isinstance(stop, str) else tuple(stop or ())
        if not all(isinstance(s, str) and s for s in stops):
            raise BadRequestError("'stop' must be a string or a list of strings.", param="stop")
        stop_ids = tuple(body.get("stop_token_ids") or ())
        if not all(isinstance(t, int) for t in stop_ids):
            raise BadRequestError("'stop_token_ids' must be integers.", param="stop_token_ids")
        return cls(
            max_tokens=max_tokens,
            temperature=temperature,
            top_p=top_p,
            top_k=_opt_int(body, "top_k") or 0,
            seed=_opt_int(body, "seed"),
            stop=stops,
            stop_token_ids=stop_ids,
            ignore_eos=_flag(body, "ignore_eos", False),
        )


@attrs.frozen(kw_only=True)
class ChatRequest:
    """A validated ``POST /v1/chat/completions`` body (the fields this server honours)."""

    model: str | None
    """Served model name or LoRA adapter name."""
    messages: list[dict[str, Any]]
    """Chat messages as sent (token metadata included)."""
    tools: list[dict[str, Any]] | None
    """Chat-format tools, or ``None``."""
    tool_choice: Any
    """``"auto"``, ``"none"``, ``"required"`` or a named function. Absent, vLLM's default:
    ``"auto"`` with tools, ``"none"`` without (an explicit ``null`` stays ``None``)."""
    sampling: RequestSampling
    """Sampling parameters."""
    logprobs: bool
    """Return ``choices[0].logprobs``."""
    top_logprobs: int
    """Alternatives per position (0-20)."""
    return_tokens_as_token_ids: bool
    """Spell logprob tokens as ``token_id:<int>``."""
    return_token_ids: bool
    """Add top-level ``prompt_token_ids`` and ``choices[0].token_ids``."""
    add_generation_prompt: bool
    """Append the assistant generation prompt."""
    continue_final_message: bool
    """Continue the final (assistant) message instead of starting a new one."""
    chat_template_kwargs: dict[str, Any]
    """Extra variables for the chat template."""
    include_reasoning: bool = True
    """Answer with the reasoning parser's ``reasoning`` (vLLM's default: yes)."""
    parallel_tool_calls: bool | None = None
    """``False``: keep the first tool call only."""

    @classmethod
    def from_json(cls, body: Any) -> ChatRequest:
        """Validate a request body; raise `BadRequestError` (HTTP 400) on anything unusable."""
        if not isinstance(body, dict):
            raise BadRequestError("The request body must be a JSON object.")
        if body.get("stream"):
            raise BadRequestError("Streaming is not supported by this server.", param="stream")
        n = _opt_int(body, "n")
        if n not in (None, 1):
            raise BadRequestError("Only n=1 is supported.", param="n")
        top_logprobs = _opt_int(body, "top_logprobs") or 0
        if not 0 <= top_logprobs <= _MAX_TOP_LOGPROBS:
            raise BadRequestError("top_logprobs must be between 0 and 20.", param="top_logprobs")
        model = body.get("model")
        if model is not None and not isinstance(model, str):
            raise BadRequestError("'model' must be a string.", param="model")
        continue_final = _flag(body, "continue_final_message", False)
        add_generation_prompt = _flag(body, "add_generation_prompt", not continue_final)
        if continue_final and add_generation_prompt:
            raise BadRequestError(
                "Cannot set both 'continue_final_message' and 'add_generation_prompt' to True."
            )
        tools = _tools(body)
        parallel = body.get("parallel_tool_calls")
        if parallel is not None and not isinstance(parallel, bool):
            raise BadRequestError(
                "'parallel_tool_calls' must be a boolean.", param="parallel_tool_calls"
            )
        return cls(
            model=model,
            messages=_messages(body),
            tools=tools,
            tool_choice=body.get("tool_choice", "auto" if tools else "none"),
            sampling=RequestSampling.from_json(body),
            logprobs=_flag(body, "logprobs", False),
            top_logprobs=top_logprobs,
            return_tokens_as_token_ids=_flag(body, "return_tokens_as_token_ids", False),
            return_token_ids=_flag(body, "return_token_ids", False),
            add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final,
            chat_template_kwargs=_kwargs(body, "chat_template_kwargs"),
            include_reasoning=_flag(body, "include_reasoning", True),
            parallel_tool_calls=parallel,
        )


@attrs.frozen(kw_only=True)
class TokenizeRequest:
    """A validated ``POST /tokenize`` body: chat ``messages`` or a plain ``prompt``."""

    model: str | None
    """Model or adapter name (checked when given)."""
    messages: list[dict[str, Any]] | None
    """Chat messages (token metadata included), or ``None`` for a prompt request."""
    prompt: str | None
    """Plain text to tokenize, or ``None`` for a chat request."""
    tools: list[dict[str, Any]] | None
    """Chat-format tools."""
    add_generation_prompt: bool
    """Append the assistant generation prompt (chat)."""
    continue_final_message: bool
    """Continue the final message (chat)."""
    add_special_tokens: bool
    """Let the tokenizer add BOS etc. (prompt requests)."""
    chat_template_kwargs: dict[str, Any]
    """Extra chat template variables."""
    return_token_strs: bool
    """Also return each token as a string."""

    @classmethod
    def from_json(cls, body: Any) -> TokenizeRequest:
        """Validate a tokenize body (vLLM's chat or completion form)."""
        if not isinstance(body, dict):
            raise BadRequestError("The request body must be a JSON object.")
        model = body.get("model")
        if model is not None and not isinstance(model, str):
            raise BadRequestError("'model' must be a string.", param="model")
        is_chat = "messages" in body
        prompt = body.get("prompt")
        if not is_chat and not isinstance(prompt, str):
            raise BadRequestError("Either 'messages' or a string 'prompt' is required.")
        continue_final = _flag(body, "continue_final_message", False)
        return cls(
            model=model,
            messages=_messages(body) if is_chat else None,
            prompt=None if is_chat else prompt,
            tools=_tools(body),
            add_generation_prompt=_flag(body, "add_generation_prompt", not continue_final),
            continue_final_message=continue_final,
            add_special_tokens=_flag(body, "add_special_tokens", not is_chat),
            chat_template_kwargs=_kwargs(body, "chat_template_kwargs"),
            return_token_strs=_flag(body, "return_token_strs", False),
        )


@attrs.frozen(kw_only=True)
class TokenLogprob:
    """One position of ``choices[0].logprobs.content``: the chosen token and alternatives."""

    token_id: int
    """The generated token."""
    logprob: float
    """Its log-probability: raw log-softmax, or of the processed distribution (server mode)."""
    text: str
    """The token decoded on its own."""
    top: tuple[tuple[int, float, str], ...] = ()
    """``(token_id, logprob, text)`` of the most likely tokens, best first."""


def logprob_entry(item: TokenLogprob, *, as_token_ids: bool) -> dict[str, Any]:
    """Return one ``logprobs.content[i]`` dict exactly as vLLM writes it."""

    def spell(token_id: int, text: str) -> str:
        return f"token_id:{token_id}" if as_token_ids else text

    return {
        "token": spell(item.token_id, item.text),
        "logprob": item.logprob,
        "bytes": list(item.text.encode("utf-8")),
        "top_logprobs": [
            {
                "token": spell(tid, text),
                "logprob": lp,
                "bytes": list(spell(tid, text).encode("utf-8")),
            }
            for tid, lp, text in item.top
        ],
    }


def usage_body(prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    """Return the ``usage`` object of a completion."""
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
        "prompt_tokens_details": None,
    }


def chat_completion_body(
    *,
    model: str,
    content: str | None,
    tool_calls: Sequence[ToolCall],
    finish_reason: FinishReason,
    reasoning: str | None = None,
    stop_reason: str | int | None,
    prompt_token_ids: Sequence[int],
    token_ids: Sequence[int],
    logprobs: Sequence[TokenLogprob] | None,
    return_token_ids: bool,
    return_tokens_as_token_ids: bool,
) -> dict[str, Any]:
    """Return a non-streaming ``chat.completion`` object shaped like vLLM's.

    ``prompt_token_ids`` (top level) and ``choices[0].token_ids`` are filled only when
    ``return_token_ids`` was requested, and are ``null`` otherwise, as in vLLM.
    """
    logprobs_body = None
    if logprobs is not None:
        logprobs_body = {
            "content": [
                logprob_entry(item, as_token_ids=return_tokens_as_token_ids) for item in logprobs
            ]
        }
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": content,
                    "refusal": None,
                    "annotations": None,
                    "audio": None,
                    "function_call": None,
                    "tool_calls": [call.to_openai() for call in tool_calls],
                    "reasoning": reasoning,
                },
                "logprobs": logprobs_body,
                "finish_reason": finish_reason,
                "stop_reason": stop_reason,
                "token_ids": list(token_ids) if return_token_ids else None,
            }
        ],
        "service_tier": None,
        "system_fingerprint": None,
        "usage": usage_body(len(prompt_token_ids), len(token_ids)),
        "prompt_logprobs": None,
        "prompt_token_ids": list(prompt_token_ids) if return_token_ids else None,
        "kv_transfer_params": None,
    }


def completion_body(
    *,
    model: str,
    text: str,
    finish_reason: FinishReason,
    stop_reason: str | int | None,
    prompt_token_ids: Sequence[int],
    token_ids: Sequence[int],
    logprobs: Sequence[TokenLogprob] | None,
    return_token_ids: bool,
    return_tokens_as_token_ids: bool,
) -> dict[str, Any]:
    """Return a non-streaming ``text_completion`` object shaped like vLLM's (the ids sit in
    the choice: ``choices[0].prompt_token_ids`` and ``choices[0].token_ids``)."""

    def spell(token_id: int, token_text: str) -> str:
        return f"token_id:{token_id}" if return_tokens_as_token_ids else token_text

    logprobs_body = None
    if logprobs is not None:
        offsets, at = [], 0
        for item in logprobs:
            offsets.append(at)
            at += len(item.text)
        logprobs_body = {
            "text_offset": offsets,
            "token_logprobs": [item.logprob for item in logprobs],
            "tokens": [spell(item.token_id, item.text) for item in logprobs],
            "top_logprobs": [
                {spell(tid, top_text): lp for tid, lp, top_text in item.top} or None
                for item in logprobs
            ],
        }
    return {
        "id": f"cmpl-{uuid.uuid4().hex}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "text": text,
                "logprobs": logprobs_body,
                "finish_reason": finish_reason,
                "stop_reason": stop_reason,
                "prompt_logprobs": None,
                "prompt_token_ids": list(prompt_token_ids) if return_token_ids else None,
                "token_ids": list(token_ids) if return_token_ids else None,
            }
        ],
        "service_tier": None,
        "system_fingerprint": None,
        "usage": usage_body(len(prompt_token_ids), len(token_ids)),
        "kv_transfer_params": None,
    }


def model_card(
    model_id: str, *, root: str, parent: str | None, max_model_len: int | None
) -> dict[str, Any]:
    """Return one ``/v1/models`` entry (vLLM's ``ModelCard``)."""
    created = int(time.time())
    return {
        "id": model_id,
        "object": "model",
        "created": created,
        "owned_by": "vllm",
        "root": root,
        "parent": parent,
        "max_model_len": max_model_len,
        "permission": [
            {
                "id": f"modelperm-{uuid.uuid4().hex}",
                "object": "model_permission",
                "created": created,
                "allow_create_engine": False,
                "allow_sampling": True,
                "allow_logprobs": True,
                "allow_search_indices": False,
                "allow_view": True,
                "allow_fine_tuning": False,
                "organization": "*",
                "group": None,
                "is_blocking": False,
            }
        ],
    }
