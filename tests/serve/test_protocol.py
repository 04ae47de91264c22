"""Request validation and vLLM-shaped response bodies (pure, no model)."""

from __future__ import annotations

from typing import Any

import pytest

from nemogym_sdk.serve.errors import BadRequestError, NotFoundError, error_body
from nemogym_sdk.serve.protocol import (
    ChatRequest,
    RequestSampling,
    TokenizeRequest,
    TokenLogprob,
    chat_completion_body,
    logprob_entry,
    model_card,
)
from nemogym_sdk.serve.tools import ToolCall

USER = [{"role": "user", "content": "hi"}]


def test_chat_request_defaults_match_vllm() -> None:
    """A minimal body: generation prompt on, no logprobs or token ids, temperature 1."""
    request = ChatRequest.from_json({"model": "m", "messages": USER})
    assert request.model == "m"
    assert request.add_generation_prompt is True
    assert request.continue_final_message is False
    assert (request.logprobs, request.return_token_ids, request.return_tokens_as_token_ids) == (
        False,
        False,
        False,
    )
    assert request.sampling == RequestSampling()
    assert request.tools is None


def test_chat_request_reads_what_vllm_model_sends() -> None:
    """The training-mode fields NeMo Gym's vllm_model adds are all honoured."""
    request = ChatRequest.from_json(
        {
            "model": "m",
            "messages": USER,
            "tools": [{"type": "function", "function": {"name": "f"}}],
            "logprobs": True,
            "top_logprobs": 0,
            "return_tokens_as_token_ids": True,
            "return_token_ids": True,
            "max_tokens": 7,
            "temperature": 0.5,
            "top_p": 0.9,
            "seed": 3,
            "stop": "END",
        }
    )
    assert request.logprobs and request.return_token_ids and request.return_tokens_as_token_ids
    assert request.sampling == RequestSampling(
        max_tokens=7, temperature=0.5, top_p=0.9, seed=3, stop=("END",)
    )
    assert request.tools is not None and len(request.tools) == 1


def test_max_completion_tokens_wins_over_max_tokens() -> None:
    """The newer OpenAI name takes precedence, as in vLLM."""
    body = {"messages": USER, "max_tokens": 9, "max_completion_tokens": 4}
    assert ChatRequest.from_json(body).sampling.max_tokens == 4


@pytest.mark.parametrize(
    "patch",
    [
        {"messages": []},
        {"messages": [{"content": "no role"}]},
        {"n": 2},
        {"stream": True},
        {"top_logprobs": 21},
        {"max_tokens": 0},
        {"temperature": -1},
        {"top_p": 0},
        {"logprobs": "yes"},
        {"stop": [1]},
        {"model": 5},
        {"continue_final_message": True, "add_generation_prompt": True},
    ],
)
def test_invalid_chat_requests_are_bad_requests(patch: dict[str, Any]) -> None:
    """Unusable fields raise BadRequestError (HTTP 400)."""
    with pytest.raises(BadRequestError):
        ChatRequest.from_json({"messages": USER, **patch})
    with pytest.raises(BadRequestError):
        ChatRequest.from_json([1, 2])


def test_tokenize_request_chat_and_prompt_forms() -> None:
    """Chat form defaults to a generation prompt; prompt form adds special tokens by default."""
    chat = TokenizeRequest.from_json({"model": "m", "messages": USER})
    assert chat.messages == USER and chat.prompt is None
    assert chat.add_generation_prompt is True and chat.add_special_tokens is False
    plain = TokenizeRequest.from_json({"prompt": "abc"})
    assert plain.prompt == "abc" and plain.messages is None and plain.add_special_tokens is True
    with pytest.raises(BadRequestError):
        TokenizeRequest.from_json({"model": "m"})


def test_logprob_entry_shapes() -> None:
    """token_id:<int> spelling, real token bytes, and top_logprobs entries like vLLM's."""
    item = TokenLogprob(token_id=104, logprob=-1.5, text="h", top=((105, -0.5, "i"),))
    as_ids = logprob_entry(item, as_token_ids=True)
    assert as_ids == {
        "token": "token_id:104",
        "logprob": -1.5,
        "bytes": [104],
        "top_logprobs": [
            {"token": "token_id:105", "logprob": -0.5, "bytes": list(b"token_id:105")}
        ],
    }
    as_text = logprob_entry(item, as_token_ids=False)
    assert as_text["token"] == "h" and as_text["top_logprobs"][0]["token"] == "i"


def test_chat_completion_body_token_id_fields_follow_return_token_ids() -> None:
    """prompt_token_ids and choices[0].token_ids are lists when asked for, null otherwise."""
    call = ToolCall(name="f", arguments="{}")
    common: dict[str, Any] = {
        "model": "m",
        "content": None,
        "tool_calls": [call],
        "finish_reason": "tool_calls",
        "stop_reason": None,
        "prompt_token_ids": [1, 2, 3],
        "token_ids": [7, 8],
        "logprobs": [TokenLogprob(token_id=7, logprob=-1.0, text="a")] * 2,
        "return_tokens_as_token_ids": True,
    }
    body = chat_completion_body(**common, return_token_ids=True)
    choice = body["choices"][0]
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
    assert body["prompt_token_ids"] == [1, 2, 3] and choice["token_ids"] == [7, 8]
    assert choice["message"]["role"] == "assistant"
    assert choice["message"]["tool_calls"] == [call.to_openai()]
    assert choice["finish_reason"] == "tool_calls"
    assert [e["token"] for e in choice["logprobs"]["content"]] == ["token_id:7", "token_id:7"]
    assert body["usage"] == {
        "prompt_tokens": 3,
        "total_tokens": 5,
        "completion_tokens": 2,
        "prompt_tokens_details": None,
    }
    plain = chat_completion_body(**common, return_token_ids=False)
    assert plain["prompt_token_ids"] is None and plain["choices"][0]["token_ids"] is None


def test_model_card_and_error_body_shapes() -> None:
    """ModelCard carries root/parent; errors nest message/type/param/code under "error"."""
    card = model_card("policy", root="/adapters/v1", parent="base", max_model_len=None)
    assert {k: card[k] for k in ("id", "object", "root", "parent", "owned_by")} == {
        "id": "policy",
        "object": "model",
        "root": "/adapters/v1",
        "parent": "base",
        "owned_by": "vllm",
    }
    body = error_body(NotFoundError("The model `x` does not exist.", param="model"))
    assert body == {
        "error": {
            "message": "The model `x` does not exist.",
            "type": "NotFoundError",
            "param": "model",
            "code": 404,
        }
    }
    assert issubclass(NotFoundError, LookupError)
