"""Before the first step: does the sampler tokenize a conversation as the learner does?

A sampler serving one model family and a learner loading another (or the same weights with
another tokenizer or chat template) produce token ids that mean different things: every
logprob ratio is then noise, and nothing crashes. `check_tokenization` renders one probe
conversation with the learner's tokenizer and asks the sampler's ``POST /tokenize`` (vLLM's
and ``nemogym-serve``'s) for the same conversation; the ids must be equal.
"""

from __future__ import annotations

from typing import Any

from nemogym_sdk._net.http import owned_session, send, server_message
from nemogym_sdk.errors import ConfigError
from nemogym_sdk.hosts import server_root

__all__ = ["PROBE_MESSAGES", "check_tokenization"]

PROBE_MESSAGES: tuple[dict[str, str], ...] = (
    {"role": "system", "content": "You are a careful assistant."},
    {"role": "user", "content": "Déjà vu: 東京 in 3 words?"},
    {"role": "assistant", "content": "<think>\nThree words.\n</think>\n\nTokyo, Japan's capital."},
    {"role": "user", "content": "And   the spaces?\n\tdef f(x): return x"},
)
"""System, user and assistant turns with non-ASCII text, runs of spaces, code and an earlier
answer's reasoning (which some templates strip): every family renders and splits it
differently."""


def _learner_ids(tokenizer: Any) -> list[int]:
    text = tokenizer.apply_chat_template(
        list(PROBE_MESSAGES), tokenize=False, add_generation_prompt=True
    )
    return list(tokenizer.encode(str(text), add_special_tokens=False))


def check_tokenization(base_url: str, tokenizer: Any, *, timeout: float = 30.0) -> bool:
    """Raise `ConfigError` when the sampler at ``base_url`` (with or without ``/v1``)
    tokenizes `PROBE_MESSAGES` differently from ``tokenizer`` (the learner's, with its chat
    template). Returns ``False``, checking nothing, when the sampler has no ``/tokenize``;
    a sampler out of reach is a ``TransportError`` or ``DeadlineError`` (``_net.http.send``)."""
    url = f"{server_root(base_url)}/tokenize"
    body = {"messages": list(PROBE_MESSAGES), "add_generation_prompt": True}
    with owned_session() as http:
        response = send(http, "POST", url, body=body, timeout=timeout)
    if response.status_code == 404:
        return False
    if response.status_code >= 400:
        raise ConfigError(
            f"the sampler's {url} answered {response.status_code} to the tokenizer probe: "
            f"{server_message(response)}"
        )
    sampled = [int(t) for t in response.json()["tokens"]]
    learned = _learner_ids(tokenizer)
    if sampled != learned:
        at = next(
            (i for i, (a, b) in enumerate(zip(sampled, learned, strict=False)) if a != b),
            min(len(sampled), len(learned)),
        )
        raise ConfigError(
            f"the sampler at {server_root(base_url)} and the learner tokenize the same "
            f"conversation differently ({len(sampled)} and {len(learned)} tokens; first "
            f"difference at token {at}: sampler {sampled[at : at + 5]}, learner "
            f"{learned[at : at + 5]}); serve and train the same model family and model, or "
            "every logprob ratio compares unrelated tokens"
        )
    return True
