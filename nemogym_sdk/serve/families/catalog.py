"""The model families: five ways of rendering a conversation, on Qwen's real vocabularies.

=============  =====================  ==========================  =========================
name           renders as             vLLM parsers                earlier reasoning
=============  =====================  ==========================  =========================
qwen2.5        Qwen2.5-Instruct       tool ``hermes``             (does not reason)
qwen3          Qwen3 (hybrid)         ``qwen3``, tool ``hermes``  stripped
qwen3.5        Qwen3.5 (248k vocab)   ``qwen3``, ``qwen3_coder``  stripped
deepseek-r1    DeepSeek-R1-Distill    ``deepseek_r1``             stripped
llama3         Llama 3.1 Instruct     tool ``llama3_json``        (does not reason)
=============  =====================  ==========================  =========================

Ids, special flags and EOS lists are those of the published tokenizers (Qwen2.5-Instruct,
Qwen3, Qwen3.5, DeepSeek-R1-Distill-Qwen). ``llama3`` is Llama 3.1's header template on
Qwen's BPE (Llama's own 128k vocabulary is not available offline): its control tokens take
the ids after the ranks. ``qwen3.5``'s tiny model is a Qwen3 decoder: the published hybrid
attention architecture does not matter for tokens, templates or parsers.
"""

from __future__ import annotations

from collections.abc import Sequence

from nemogym_sdk.errors import ConfigError
from nemogym_sdk.serve.families.family import Architecture, Family, SpecialToken
from nemogym_sdk.serve.families.vocab import Vocabulary

__all__ = ["FAMILIES", "family_named"]

_PLAIN = frozenset(
    {
        "<tool_call>",
        "</tool_call>",
        "<tool_response>",
        "</tool_response>",
        "<think>",
        "</think>",
        "<|fim_prefix|>",
        "<|fim_middle|>",
        "<|fim_suffix|>",
        "<|fim_pad|>",
        "<|repo_name|>",
        "<|file_sep|>",
    }
)
"""Qwen's added tokens that are not special: ``decode(skip_special_tokens=True)`` keeps them."""

_QWEN_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<tool_call>",
    "</tool_call>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
)
_QWEN3_TOKENS = (*_QWEN_TOKENS, "<tool_response>", "</tool_response>", "<think>", "</think>")
_QWEN3_5_TOKENS = (
    *_QWEN3_TOKENS,
    "<|audio_start|>",
    "<|audio_end|>",
    "<tts_pad>",
    "<tts_text_bos>",
    "<tts_text_eod>",
    "<tts_text_bos_single>",
    "<|audio_pad|>",
)
# DeepSeek's distills replace Qwen's first seven added tokens with their own.
_R1_TOKENS = (
    "<｜end▁of▁sentence｜>",
    "<｜User｜>",
    "<｜Assistant｜>",
    "<｜begin▁of▁sentence｜>",
    "<|EOT|>",
    "<think>",
    "</think>",
    *_QWEN_TOKENS[7:],
)
_R1_SPECIAL = frozenset({"<｜end▁of▁sentence｜>", "<｜begin▁of▁sentence｜>"})
_LLAMA_TOKENS = (
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eom_id|>",
    "<|eot_id|>",
    "<|python_tag|>",
    "<|finetune_right_pad_id|>",
)


def _tokens(
    vocabulary: Vocabulary, texts: Sequence[str], *, special: frozenset[str] | None = None
) -> tuple[SpecialToken, ...]:
    """``texts`` at the ids after ``vocabulary``'s ranks; special unless Qwen's plain ones
    (or, given ``special``, exactly those)."""
    return tuple(
        SpecialToken(
            vocabulary.size + offset,
            text,
            text in special if special is not None else text not in _PLAIN,
        )
        for offset, text in enumerate(texts)
    )


def _qwen_family(
    name: str, summary: str, vocabulary: Vocabulary, texts: Sequence[str], **kw: object
) -> Family:
    added = _tokens(vocabulary, texts)
    ids = {token.text: token.id for token in added}
    return Family(
        name=name,
        summary=summary,
        vocabulary=vocabulary,
        added_tokens=added,
        template_file=f"{name}.jinja",
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        generation_eos=(ids["<|im_end|>"], ids["<|endoftext|>"]),
        **kw,  # type: ignore[arg-type]
    )


FAMILIES: dict[str, Family] = {
    family.name: family
    for family in (
        _qwen_family(
            "qwen2.5",
            "Qwen2.5-Instruct: ChatML, default system prompt, hermes tool calls",
            Vocabulary.QWEN,
            _QWEN_TOKENS,
            architecture=Architecture.QWEN2,
            vocab_size=151_936,
            tool_call_parser="hermes",
        ),
        _qwen_family(
            "qwen3",
            "Qwen3 hybrid thinking: <think> kept after the last query only, hermes tool calls",
            Vocabulary.QWEN,
            _QWEN3_TOKENS,
            architecture=Architecture.QWEN3,
            vocab_size=151_936,
            reasoning_parser="qwen3",
            tool_call_parser="hermes",
            strips_reasoning=True,
        ),
        _qwen_family(
            "qwen3.5",
            "Qwen3.5: the 248k vocabulary, thinking by default, XML tool calls",
            Vocabulary.QWEN3_5,
            _QWEN3_5_TOKENS,
            architecture=Architecture.QWEN3,
            vocab_size=248_320,
            reasoning_parser="qwen3",
            tool_call_parser="qwen3_coder",
            strips_reasoning=True,
        ),
        Family(
            name="deepseek-r1",
            summary="DeepSeek-R1-Distill-Qwen: <｜User｜> and <｜Assistant｜> turns",
            vocabulary=Vocabulary.QWEN,
            added_tokens=_tokens(Vocabulary.QWEN, _R1_TOKENS, special=_R1_SPECIAL),
            template_file="deepseek-r1.jinja",
            bos_token="<｜begin▁of▁sentence｜>",
            eos_token="<｜end▁of▁sentence｜>",
            pad_token="<｜end▁of▁sentence｜>",
            generation_eos=(Vocabulary.QWEN.size,),
            architecture=Architecture.QWEN2,
            vocab_size=152_064,
            reasoning_parser="deepseek_r1",
            strips_reasoning=True,
        ),
        Family(
            name="llama3",
            summary="Llama 3.1 Instruct header turns on Qwen's BPE, JSON tool calls",
            vocabulary=Vocabulary.QWEN,
            added_tokens=_tokens(Vocabulary.QWEN, _LLAMA_TOKENS, special=frozenset(_LLAMA_TOKENS)),
            template_file="llama3.jinja",
            bos_token="<|begin_of_text|>",
            eos_token="<|eot_id|>",
            pad_token="<|finetune_right_pad_id|>",
            generation_eos=tuple(Vocabulary.QWEN.size + i for i in (1, 4, 5)),
            architecture=Architecture.LLAMA,
            vocab_size=151_936,
            tool_call_parser="llama3_json",
        ),
    )
}
"""Every family by name (``--model-family``)."""


def family_named(name: str) -> Family:
    """The family called ``name``; `ConfigError` naming the known ones otherwise."""
    try:
        return FAMILIES[name]
    except KeyError:
        known = ", ".join(FAMILIES)
        raise ConfigError(f"Unknown model family {name!r}; known: {known}") from None
