"""vLLM's ``POST /v1/completions``, token in and token out, as `VllmBackend` speaks it.

`completion_request` builds the body (the prompt as a token-id list, the sampling settings,
``return_tokens_as_token_ids``), `parse_completion` turns the answer into a `Generation`:
per generated token ``choices[0].token_ids[i]`` and ``logprobs.token_logprobs[i]``, checked
against ``logprobs.tokens[i] == "token_id:<id>"`` so that the logprob is the sampled
token's, and the echoed prompt ids against the ones sent (a 502 when anything is missing).
`error_message` reads vLLM's error bodies.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from nemogym_sdk.serve.errors import BadGatewayError
from nemogym_sdk.serve.interface import MASKED_LOGPROB, Generation
from nemogym_sdk.serve.protocol import RequestSampling, TokenLogprob

__all__ = ["completion_request", "error_message", "parse_completion", "token_id_of"]

_TOKEN_ID_PREFIX = "token_id:"


def completion_request(
    prompt_ids: Sequence[int],
    params: RequestSampling,
    *,
    model: str,
    seed: int | None,
    max_tokens: int,
    top_logprobs: int = 0,
) -> dict[str, Any]:
    """Return the ``POST /v1/completions`` body for one generation (token ids in and out).

    ``seed`` None leaves it out: vLLM then samples from its engine-wide generator.
    """
    body: dict[str, Any] = {
        "model": model,
        "prompt": list(prompt_ids),
        "max_tokens": max_tokens,
        "temperature": params.temperature,
        "top_p": params.top_p,
        "logprobs": top_logprobs,
        "return_token_ids": True,
        "return_tokens_as_token_ids": True,
    }
    if seed is not None:
        body["seed"] = seed
    if params.top_k > 0:
        body["top_k"] = params.top_k
    if params.stop:
        body["stop"] = list(params.stop)
    if params.stop_token_ids:
        body["stop_token_ids"] = list(params.stop_token_ids)
    if params.ignore_eos:
        body["ignore_eos"] = True
    return body


def token_id_of(spelled: Any) -> int:
    """The id in vLLM's ``"token_id:<id>"`` spelling of a token; 502 otherwise."""
    if not isinstance(spelled, str) or not spelled.startswith(_TOKEN_ID_PREFIX):
        raise BadGatewayError(
            f"vLLM spelled a logprob token as {spelled!r}, not 'token_id:<id>' "
            "(return_tokens_as_token_ids was ignored)."
        )
    return int(spelled[len(_TOKEN_ID_PREFIX) :])


def _logprob(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        raise BadGatewayError(f"vLLM returned a logprob that is not a number: {value!r}.")
    return max(float(value), MASKED_LOGPROB)


def _top(entry: Any, k: int, text: Any) -> tuple[tuple[int, float, str], ...]:
    """The ``k`` best alternatives of one position (vLLM's dict also holds the sampled token)."""
    if k <= 0 or not isinstance(entry, Mapping):
        return ()
    pairs = sorted(((token_id_of(t), _logprob(lp)) for t, lp in entry.items()), key=lambda p: -p[1])
    return tuple((tid, lp, text(tid)) for tid, lp in pairs[:k])


def parse_completion(
    body: Any,
    prompt_ids: Sequence[int],
    *,
    token_text: Any,
    top_logprobs: int = 0,
    stop: Sequence[str] = (),
    decode: Any = None,
) -> Generation:
    """Turn vLLM's ``/v1/completions`` answer into a `Generation`; 502 if anything is missing.

    ``token_text(id) -> str`` spells a token; ``decode(ids) -> str`` (needed only with stop
    strings) finds where the stop string begins so the text can be cut there.
    """
    try:
        choice = body["choices"][0]
        token_ids = choice["token_ids"]
        logprobs = choice["logprobs"]
        spelled = logprobs["tokens"]
        values = logprobs["token_logprobs"]
    except (KeyError, IndexError, TypeError) as error:
        raise BadGatewayError(
            f"vLLM's completion lacks token ids or logprobs ({type(error).__name__}: {error}); "
            "is it vLLM >= 0.10 with return_token_ids?"
        ) from error
    echoed = choice.get("prompt_token_ids")
    if echoed is not None and list(echoed) != list(prompt_ids):
        raise BadGatewayError("vLLM generated from other prompt ids than the ones it was sent.")
    if not isinstance(token_ids, list) or not len(token_ids) == len(spelled) == len(values):
        raise BadGatewayError(
            "vLLM returned token ids and logprobs of different lengths "
            f"({len(token_ids) if isinstance(token_ids, list) else token_ids!r}, "
            f"{len(spelled)}, {len(values)})."
        )
    tops = logprobs.get("top_logprobs") or [None] * len(token_ids)
    tokens: list[TokenLogprob] = []
    for token_id, name, value, top in zip(token_ids, spelled, values, tops, strict=False):
        if token_id_of(name) != token_id:
            raise BadGatewayError(
                f"vLLM's logprob entry {name!r} is not the sampled token {token_id}."
            )
        tokens.append(
            TokenLogprob(
                token_id=token_id,
                logprob=_logprob(value),
                text=token_text(token_id),
                top=_top(top, top_logprobs, token_text),
            )
        )
    stop_reason = choice.get("stop_reason")
    text_end = None
    if isinstance(stop_reason, str) and stop_reason in stop and decode is not None:
        at = decode(token_ids).find(stop_reason)
        text_end = at if at >= 0 else None
    finish = choice.get("finish_reason")
    return Generation(
        tokens=tuple(tokens),
        finish_reason="length" if finish == "length" else "stop",
        stop_reason=stop_reason if isinstance(stop_reason, (str, int)) else None,
        text_end=text_end,
    )


def error_message(status: int, raw: bytes) -> tuple[str, str | None, str | None]:
    """vLLM's error message, type and param (``{"error": {...}}`` or the older flat shape)."""
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return raw.decode("utf-8", "replace")[:2000] or f"HTTP {status}", None, None
    error = data.get("error") if isinstance(data, dict) else None
    source = error if isinstance(error, dict) else data if isinstance(data, dict) else {}
    message = source.get("message") or source.get("detail") or f"HTTP {status}"
    return str(message), source.get("type"), source.get("param")
