"""Fine-tune a family's tiny model on its `lessons`, so that sampling it produces the
family's markup: ``<think>`` blocks, tool calls its vLLM parser reads, EOS.

This keeps vLLM's own parsers in the path (rather than forcing the format with structured
outputs, which would need every request changed, and which NeMo Gym's ``vllm_model``
straight to vLLM does not send): the model writes the markup, and whoever serves it, parses
it. A few hundred AdamW steps on CPU, loss on the completion tokens only; the taught model
is cached like `family_model_dir`'s, keyed by the lessons' settings too.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import attrs

from nemogym_sdk.serve.families.build import build_family_tokenizer, cached_dir
from nemogym_sdk.serve.families.family import Family
from nemogym_sdk.serve.families.lessons import Lesson, lessons

__all__ = ["Teaching", "taught_model_dir", "teach"]


@attrs.frozen(kw_only=True)
class Teaching:
    """How a model is taught: lessons drawn, steps, batch size, learning rate, seed."""

    lessons: int = 256
    steps: int = 150
    batch_size: int = 8
    lr: float = 8e-3
    seed: int = 0


def _batch(tokenizer: Any, drawn: list[Lesson]) -> tuple[Any, Any, Any]:
    """(ids [B, T], attention mask, target mask: the completion's tokens), right-padded."""
    import torch

    rows, targets = [], []
    for lesson in drawn:
        prompt = tokenizer.encode(lesson.prompt, add_special_tokens=False)
        completion = tokenizer.encode(lesson.completion, add_special_tokens=False)
        rows.append(prompt + completion)
        targets.append([0] * len(prompt) + [1] * len(completion))
    width = max(map(len, rows))
    ids = torch.full((len(rows), width), int(tokenizer.pad_token_id))
    attention = torch.zeros((len(rows), width), dtype=torch.long)
    target = torch.zeros((len(rows), width), dtype=torch.bool)
    for row, (tokens, marks) in enumerate(zip(rows, targets, strict=True)):
        ids[row, : len(tokens)] = torch.tensor(tokens)
        attention[row, : len(tokens)] = 1
        target[row, : len(tokens)] = torch.tensor(marks, dtype=torch.bool)
    return ids, attention, target


def teach(model: Any, tokenizer: Any, drawn: list[Lesson], teaching: Teaching) -> list[float]:
    """Train ``model`` in place on ``drawn``; the loss of each step. Logits are computed at
    the completion's positions only (a full ``[B, T, V]`` at a 152k vocabulary would not be
    small)."""
    import torch

    decoder = getattr(model, model.base_model_prefix)
    head = model.get_output_embeddings()
    # the input embeddings stay as drawn: a third of the weights, and nothing to learn there
    model.get_input_embeddings().requires_grad_(False)
    learned = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(learned, lr=teaching.lr, weight_decay=0.0, fused=True)
    # linear decay to 0: the last steps settle, so that sampling at temperature 1 is sharp
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: 1.0 - step / teaching.steps
    )
    rng = random.Random(teaching.seed)
    losses = []
    model.train(True)
    for _ in range(teaching.steps):
        ids, attention, target = _batch(tokenizer, rng.sample(drawn, teaching.batch_size))
        hidden = decoder(input_ids=ids, attention_mask=attention).last_hidden_state
        picked = target[:, 1:]  # position t predicts token t + 1
        logits = head(hidden[:, :-1][picked])
        loss = torch.nn.functional.cross_entropy(logits, ids[:, 1:][picked])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()  # type: ignore[no-untyped-call]
        optimizer.step()
        schedule.step()
        losses.append(float(loss.detach()))
    model.train(False)
    model.get_input_embeddings().requires_grad_(True)
    return losses


def taught_model_dir(
    family: Family,
    seed: int = 0,
    *,
    teaching: Teaching = Teaching(),
    root: str | Path | None = None,
) -> Path:
    """The cached directory of ``family``'s tiny model (weights from ``seed``) taught its
    markup; built on first use (tens of seconds on a CPU), then reused."""

    def build(directory: Path) -> dict[str, Any]:
        from nemogym_sdk.serve.families.build import build_family_model

        tokenizer = build_family_tokenizer(family)
        model: Any = build_family_model(family, seed)
        drawn = lessons(family, tokenizer, teaching.lessons, seed=teaching.seed)
        losses = teach(model, tokenizer, drawn, teaching)
        model.save_pretrained(directory)
        tokenizer.save_pretrained(directory)
        return {"first_loss": losses[0], "last_loss": losses[-1], **attrs.asdict(teaching)}

    sources = [Path(__file__), Path(__file__).with_name("lessons.py")]  # what lessons teach
    key = (repr(teaching), *(path.read_text() for path in sources))
    return cached_dir(family, seed, build, extra_key=key, root=root, label="taught")
