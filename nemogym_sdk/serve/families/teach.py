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

__all__ = ["Teaching", "taught_model_dir", "taught_rows", "teach"]


@attrs.frozen(kw_only=True)
class Teaching:
    """How a model is taught: lessons drawn, steps, batch size, learning rate, seed."""

    lessons: int = 256
    steps: int = 300
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


def taught_rows(tokenizer: Any, drawn: list[Lesson]) -> list[int]:
    """The head rows the lessons' completions use (their tokens), sorted."""
    used: set[int] = set()
    for lesson in drawn:
        used.update(tokenizer.encode(lesson.completion, add_special_tokens=False))
    return sorted(used)


def teach(model: Any, tokenizer: Any, drawn: list[Lesson], teaching: Teaching) -> list[float]:
    """Train ``model`` in place on ``drawn``; the loss of each step.

    Only the LM head's rows of the tokens the completions use are taught (`taught_rows`, a
    few hundred); every other row is set to zero, so each of those tokens keeps logit 0 for
    any hidden state. The loss is then the full-vocabulary cross-entropy exactly: the
    taught rows' logits and one more, ``log(number of zero rows)``, standing for all of
    them. So a step costs a few hundred head rows, not 152k or 248k, and the saved model
    samples (over its whole vocabulary) the distribution that was trained."""
    import math

    import torch

    decoder = getattr(model, model.base_model_prefix)
    head = model.get_output_embeddings().weight  # [V, H]
    rows = taught_rows(tokenizer, drawn)
    index = torch.tensor(rows)
    position = torch.full((head.shape[0],), -1, dtype=torch.long)
    position[index] = torch.arange(len(rows))
    rest = math.log(head.shape[0] - len(rows))  # logsumexp of the zero rows' logits
    taught = torch.nn.Parameter(head.detach()[index].clone())
    # the input embeddings stay as drawn (nothing to learn there); the head is `taught`
    model.get_input_embeddings().requires_grad_(False)
    model.get_output_embeddings().requires_grad_(False)
    learned = [taught, *(p for p in model.parameters() if p.requires_grad)]
    optimizer = torch.optim.AdamW(learned, lr=teaching.lr, weight_decay=0.0)
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
        logits = hidden[:, :-1][picked] @ taught.T
        logits = torch.cat([logits, logits.new_full((logits.shape[0], 1), rest)], dim=1)
        loss = torch.nn.functional.cross_entropy(logits, position[ids[:, 1:][picked]])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()  # type: ignore[no-untyped-call]
        optimizer.step()
        schedule.step()
        losses.append(float(loss.detach()))
    model.train(False)
    with torch.no_grad():
        head.zero_()
        head[index] = taught.detach()
    model.get_input_embeddings().requires_grad_(True)
    model.get_output_embeddings().requires_grad_(True)
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
