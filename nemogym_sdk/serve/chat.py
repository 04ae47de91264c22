"""Chat messages to prompt token ids, with the on-policy prefix splice.

NeMo Gym's ``vllm_model`` forwards, on each assistant message it produced earlier, the exact
``prompt_token_ids`` and ``generation_token_ids`` of that turn. Re-rendering the conversation
through the chat template would re-tokenize the model's own output (and may differ: invalid
UTF-8, BPE re-splits, template normalisation), which breaks the token history a trainer relies on.
The backend therefore splices, as NeMo RL's vLLM worker does (its ``_replace_prefix_tokens``):

    model_prefix    = prompt_token_ids + generation_token_ids   (of the last such assistant turn)
    template_prefix = template(messages[: that turn + 1], no generation prompt)
    template_ids    = template(messages, generation prompt)
    n               = how many EOS tokens template_prefix holds (the turn ends at the n-th)
    eos_pos         = the n-th EOS of template_ids
    prompt          = model_prefix (minus a trailing EOS) + template_ids[eos_pos:]

so the next prompt starts with the previous ``prompt_token_ids + generation_token_ids``.

That is the ``contiguous`` history (`HISTORIES`), the default: what is trained equals what
was sampled, and a prompt may differ from the published template's rendering (a template
that strips earlier reasoning keeps it here). The ``template`` history renders every prompt
through the template, as plain vLLM does: each prompt is the published rendering, and where
it rewrites an earlier turn the episode forks (``DriftPolicy.FORK``: one trace per part, each
trained on the prompt its turns were sampled from).

Everything here is a pure function over token ids and JSON messages; rendering is passed in as
a callable so it can be unit-tested without a tokenizer.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Collection, Mapping, Sequence
from typing import Any, Literal, Protocol

from nemogym_sdk.serve.errors import BadRequestError

__all__ = [
    "HISTORIES",
    "TOKEN_FIELDS",
    "History",
    "RenderFn",
    "SpliceError",
    "build_prompt_ids",
    "count_assistant_turns",
    "developer_as_system",
    "last_tokenized_assistant",
    "model_prefix_of",
    "normalize_messages",
    "splice_prefix",
]

History = Literal["contiguous", "template"]
HISTORIES: tuple[History, ...] = ("contiguous", "template")
"""How a prompt holds the conversation so far: ``contiguous`` splices the model's own tokens
(every turn extends the last), ``template`` renders the template afresh (the published
prompt; the episode forks where the template rewrites history)."""

TOKEN_FIELDS = (
    "prompt_token_ids",
    "generation_token_ids",
    "generation_log_probs",
    "routed_experts",
)
"""Message keys that carry token metadata; never passed to the chat template."""


class SpliceError(BadRequestError):
    """The conversation cannot be spliced onto the model's own tokens."""


class RenderFn(Protocol):
    """Render chat messages to token ids through a chat template."""

    def __call__(
        self,
        messages: Sequence[Mapping[str, Any]],
        /,
        *,
        add_generation_prompt: bool,
        continue_final_message: bool,
    ) -> list[int]: ...


def count_assistant_turns(messages: Sequence[Mapping[str, Any]]) -> int:
    """Return how many assistant messages the conversation already holds."""
    return sum(1 for m in messages if m.get("role") == "assistant")


def _int_list(value: Any, field: str, index: int) -> list[int]:
    if not isinstance(value, list) or not all(
        isinstance(t, int) and not isinstance(t, bool) for t in value
    ):
        raise SpliceError(f"messages[{index}].{field} must be a list of integer token ids.")
    return value


def last_tokenized_assistant(messages: Sequence[Mapping[str, Any]]) -> int | None:
    """Return the index of the last assistant message that carries its token ids, if any.

    A message counts when it has a non-empty ``prompt_token_ids`` or ``generation_token_ids``;
    one without the other is an error (the pair travels together).
    """
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        if message.get("role") != "assistant":
            continue
        prompt = message.get("prompt_token_ids")
        generation = message.get("generation_token_ids")
        if prompt is None and generation is None:
            continue
        if prompt is None or generation is None:
            missing = "prompt_token_ids" if prompt is None else "generation_token_ids"
            raise SpliceError(f"messages[{index}] carries token ids but no {missing}.")
        return index
    return None


def model_prefix_of(message: Mapping[str, Any], index: int = 0) -> list[int]:
    """Return ``prompt_token_ids + generation_token_ids`` of a tokenized assistant message."""
    prompt = _int_list(message.get("prompt_token_ids"), "prompt_token_ids", index)
    generation = _int_list(message.get("generation_token_ids"), "generation_token_ids", index)
    return [*prompt, *generation]


def splice_prefix(
    model_prefix: Sequence[int],
    template_prefix: Sequence[int],
    template_ids: Sequence[int],
    eos_token_ids: Collection[int],
) -> list[int]:
    """Return ``model_prefix`` followed by what the template adds after the last turn's EOS.

    ``template_prefix`` is the template rendering of the conversation up to and including the
    tokenized assistant turn (no generation prompt); ``template_ids`` the rendering of the whole
    request. The turn's EOS is found by count, not by position: when ``template_prefix`` ends
    with its n-th EOS, the n-th EOS of ``template_ids`` ends the same turn even where the
    template rendered the history shorter the second time (Qwen3 and DeepSeek-R1 drop an
    earlier turn's reasoning once a new user message follows). If ``model_prefix`` already
    ends with an EOS it is kept as emitted and the template's own boundary EOS is dropped, so
    the result always starts with ``model_prefix`` exactly. Raises `SpliceError` when the
    prefix holds no EOS or the request's rendering holds fewer than the prefix.
    """
    if not model_prefix:
        return list(template_ids)
    turns = sum(1 for token in template_prefix if token in eos_token_ids)
    if turns == 0:
        raise SpliceError(
            "Cannot splice the model's tokens: no EOS token found in the chat-templated history."
        )
    eos_pos, seen = -1, 0
    for pos, token in enumerate(template_ids):
        if token in eos_token_ids:
            seen += 1
            if seen == turns:
                eos_pos = pos
                break
    if eos_pos < 0 or eos_pos == len(template_ids) - 1:
        raise SpliceError(
            "Cannot splice the model's tokens: the chat template rendering did not grow past the "
            f"tokenized assistant turn (its turn ends at EOS {turns}, the rendering has {seen})."
        )
    tail = list(template_ids[eos_pos:])
    if model_prefix[-1] in eos_token_ids:
        tail = tail[1:]
    return [*model_prefix, *tail]


def normalize_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Return template-ready copies of chat messages, as vLLM prepares them.

    Token metadata fields are dropped; a content list of text parts becomes one string (parts
    joined by newlines); ``tool_calls[].function.arguments`` JSON strings are decoded to objects
    (templates render them with ``tojson``); a non-decodable arguments string is kept as is.
    """
    out: list[dict[str, Any]] = []
    for index, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise BadRequestError(f"messages[{index}] must be an object.")
        clean = {k: copy.deepcopy(v) for k, v in message.items() if k not in TOKEN_FIELDS}
        content = clean.get("content")
        if isinstance(content, list):
            texts = [
                part.get("text", "")
                for part in content
                if isinstance(part, Mapping) and isinstance(part.get("text"), str)
            ]
            clean["content"] = "\n".join(texts)
        tool_calls = clean.get("tool_calls")
        if isinstance(tool_calls, list):
            for call in tool_calls:
                function = call.get("function") if isinstance(call, dict) else None
                if isinstance(function, dict) and isinstance(function.get("arguments"), str):
                    try:
                        decoded = json.loads(function["arguments"])
                    except ValueError:
                        continue
                    if isinstance(decoded, dict):
                        function["arguments"] = decoded
        out.append(clean)
    return out


def developer_as_system(
    messages: Sequence[Mapping[str, Any]], chat_template: str
) -> list[dict[str, Any]]:
    """Messages as vLLM hands them to a chat template that does not name the ``developer``
    role: each ``developer`` message becomes a ``system`` one (its ``tools`` dropped), and
    then every system message is merged into one at the front, their texts joined by a
    blank line. A template that names the role gets the messages unchanged."""
    copies = [dict(m) for m in messages]
    if '"developer"' in chat_template or "'developer'" in chat_template:
        return copies
    if not any(m.get("role") == "developer" for m in copies):
        return copies
    for message in copies:
        if message.get("role") == "developer":
            message["role"] = "system"
            message.pop("tools", None)
    systems = [i for i, m in enumerate(copies) if m.get("role") == "system"]
    if systems == [0] or not systems:
        return copies
    texts = [copies[i].get("content") for i in systems]
    merged = "\n\n".join(t for t in texts if isinstance(t, str) and t)
    rest = [m for m in copies if m.get("role") != "system"]
    return [{"role": "system", "content": merged}, *rest]


def build_prompt_ids(
    messages: Sequence[Mapping[str, Any]],
    render: RenderFn,
    eos_token_ids: Collection[int],
    *,
    add_generation_prompt: bool = True,
    continue_final_message: bool = False,
) -> list[int]:
    """Return the prompt token ids for ``messages``, spliced onto the model's own tokens.

    Without a tokenized assistant message this is the plain template rendering. With one, the
    result starts with that message's ``prompt_token_ids + generation_token_ids`` (see module doc).
    """
    clean = normalize_messages(messages)
    template_ids = render(
        clean,
        add_generation_prompt=add_generation_prompt,
        continue_final_message=continue_final_message,
    )
    index = last_tokenized_assistant(messages)
    if index is None:
        return template_ids
    model_prefix = model_prefix_of(messages[index], index)
    template_prefix = render(
        clean[: index + 1], add_generation_prompt=False, continue_final_message=False
    )
    return splice_prefix(model_prefix, template_prefix, template_ids, eos_token_ids)
