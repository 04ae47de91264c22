"""Episodes a real tokenizer and chat template make, with drift for the reasons real models
drift: ``templated_episodes(tokenizer)``.

``episodes()`` draws small integers and plants drift by hand. Here each episode is a
conversation played as NeMo Gym and a sampler play it: the model's turn is text (reasoning in
``<think>`` blocks, hermes tool calls with their JSON spaced one way or another, words of
English, code and CJK), its generation is that text's token ids, sometimes not the canonical
tokenization (a sampler may emit ``"hel" + "lo"`` where ``encode`` gives ``"hello"``), plus
EOS; the parsers read it as vLLM's would (`nemogym_sdk.serve.parsers`); the environment
answers (a tool's result, or the user again); and the next prompt is:

- ``history="template"``: the chat template's rendering of the conversation, as plain vLLM
  makes it. It drifts where the template rewrites what was sampled: a BPE merge of a
  non-canonical generation (``retokenized``), earlier reasoning the template strips
  (``stripped``), a tool call written again with the template's own JSON spacing
  (``rerendered``). ``Episode.drift_turns`` and ``drift_kinds`` say where, measured on the
  ids, not planted.
- ``history="contiguous"``: the model's own tokens of the earlier turns with the template's
  rendering of the new messages after them (`nemogym_sdk.serve.chat`'s prefix splice), as
  ``nemogym_sdk.serve`` makes it: it never drifts, and the environment tokens are the
  template's real glue.

The checks take it through ``find_failures(parser, tokenizer=...)``. Needs a fast
tokenizer with a chat template (``transformers``) and the ``serve`` extra's Jinja.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Literal

from hypothesis import strategies as st

from nemogym_sdk.errors import ConfigError
from nemogym_sdk.testing.episodes import (
    JSON_REWARDS,
    LOGPROBS,
    DriftKind,
    Episode,
    _assemble,
    _model_item,
)

__all__ = ["WEATHER_TOOL", "WORDS", "drift_kind", "templated_episodes"]

WORDS = st.sampled_from(
    [
        *("the", "weather", "in", "Paris", "hello", "world", "answer", "is", "42", "yes"),
        *("def", "f(x):", "return", "x+1", "{}", "[0]", "->", "==", "//", "::"),
        *("日本", "天气", "你好", "東京", "é", "ñ", "über", "naïve", "😀", "—"),
        *(" ", "  ", "\n", "\t", ".", ",", "!", "?", "'s", "ing"),
    ]
)
"""Pieces of text: English, code, CJK, accents and whitespace, where BPE merges differ."""
WEATHER_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
"""The tool offered to the model (every drawn call calls it)."""

History = Literal["template", "contiguous"]


def _text(min_size: int = 1, max_size: int = 6) -> st.SearchStrategy[str]:
    return st.lists(WORDS, min_size=min_size, max_size=max_size).map("".join)


@st.composite
def _tool_call(draw: st.DrawFn) -> str:
    """A hermes tool call, its JSON spaced as ``json.dumps`` spaces it or not."""
    call = {"name": "get_weather", "arguments": {"city": draw(_text(1, 3))}}
    compact = draw(st.booleans())
    body = json.dumps(call, ensure_ascii=False, separators=(",", ":") if compact else None)
    return f"<tool_call>\n{body}\n</tool_call>"


@st.composite
def _assistant_text(draw: st.DrawFn, *, reasons: bool, calls: bool) -> str:
    """A model turn's text: maybe reasoning, then a tool call (when ``calls``) or words."""
    text = ""
    if reasons and draw(st.booleans()):
        text += f"<think>\n{draw(_text())}\n</think>\n\n"
    return text + (draw(_tool_call()) if calls and draw(st.booleans()) else draw(_text()))


@st.composite
def _token_ids(draw: st.DrawFn, encode: Any, text: str) -> list[int]:
    """``text``'s ids: its canonical tokenization, or the two halves of a cut tokenized
    apart (what a sampler emits when it does not take the longest merge)."""
    if len(text) < 2 or draw(st.booleans()):
        return list(encode(text))
    cut = draw(st.integers(1, len(text) - 1))
    return list(encode(text[:cut])) + list(encode(text[cut:]))


def drift_kind(
    decode: Any,
    previous_prompt: Sequence[int],
    generation: Sequence[int],
    prompt: Sequence[int],
    reasoned: bool,
) -> DriftKind:
    """Why ``prompt`` does not extend the previous turn's ``previous_prompt + generation``:
    the same text tokenized otherwise (``retokenized``); the texts part inside the turn's
    reasoning, which the parser took out and the template left out (``stripped``; all of
    the turn when it never closed ``</think>``, as vLLM's parsers read it); or they part
    after it, where the template wrote the answer or tool call again (``rerendered``)."""
    seen = decode([*previous_prompt, *generation])
    following = decode(list(prompt))
    if following.startswith(seen):
        return "retokenized"
    part = next(
        (i for i, (a, b) in enumerate(zip(seen, following, strict=False)) if a != b),
        min(len(seen), len(following)),
    )
    start = len(decode(list(previous_prompt)))
    text = decode(list(generation))
    close = text.find("</think>")
    reasoning_end = len(text) if close < 0 else close + len("</think>")
    if reasoned and start <= part < start + reasoning_end:
        return "stripped"
    return "rerendered"


def templated_episodes(
    tokenizer: Any,
    *,
    history: History = "template",
    reasoning_parser: str | None = None,
    tool_call_parser: str | None = "hermes",
    eos_token_id: int | None = None,
    min_turns: int = 2,
    max_turns: int = 4,
    logprobs: st.SearchStrategy[float] = LOGPROBS,
    rewards: st.SearchStrategy[float] = JSON_REWARDS,
) -> st.SearchStrategy[Episode]:
    """``/run`` results of conversations rendered by ``tokenizer``'s chat template.

    Args:
        tokenizer: a fast tokenizer with a chat template (e.g. a model family's).
        history: ``template`` (prompts as plain vLLM renders them; drift where the template
            rewrites what was sampled) or ``contiguous`` (the sampler's prefix splice; no
            drift).
        reasoning_parser: vLLM's name of the reasoning parser (``qwen3``, ``deepseek_r1``)
            when the model writes ``<think>`` blocks; None: it does not reason.
        tool_call_parser: ``hermes`` (the model calls ``WEATHER_TOOL``) or None (no tools).
        eos_token_id: the id that ends a generation; default the tokenizer's.
        min_turns: fewest model turns (at least 1).
        max_turns: most model turns.
        logprobs: each generated token's logprob.
        rewards: the episode's ``reward``.
    """
    from nemogym_sdk.serve.parsers import OutputParsers
    from nemogym_sdk.serve.template import ChatTemplate

    if history not in ("template", "contiguous"):
        raise ConfigError(f"history must be 'template' or 'contiguous', got {history!r}")
    if tool_call_parser not in ("hermes", None):
        raise ConfigError(f"templated episodes write hermes tool calls, not {tool_call_parser!r}")
    if not 1 <= min_turns <= max_turns:
        raise ValueError(f"need 1 <= min_turns <= max_turns, got {min_turns} and {max_turns}")
    eos = tokenizer.eos_token_id if eos_token_id is None else eos_token_id
    if not isinstance(eos, int):
        raise ConfigError("the tokenizer has no EOS id: pass eos_token_id")
    template = ChatTemplate(tokenizer, eos_token_ids={eos}, name="templated_episodes")
    parsers = OutputParsers(reasoning=reasoning_parser, tool_calls=tool_call_parser)
    play = _Play(template, parsers, history, eos, logprobs)
    return _episodes(play, min_turns, max_turns, rewards)


class _Play:
    """What every episode of one strategy shares: the template, the parsers, the rules."""

    def __init__(
        self,
        template: Any,
        parsers: Any,
        history: History,
        eos: int,
        logprobs: st.SearchStrategy[float],
    ) -> None:
        self.template = template
        self.parsers = parsers
        self.history = history
        self.eos = eos
        self.logprobs = logprobs
        self.tools = [WEATHER_TOOL] if parsers.tool_calls is not None else None

    def decode(self, ids: list[int]) -> str:
        return str(self.template.tokenizer.decode(ids, skip_special_tokens=False))

    def prompt(self, messages: list[dict[str, Any]], turn: int) -> list[int]:
        """The next prompt: the template's rendering, or the splice onto the model's tokens."""
        if self.history == "contiguous" and turn > 0:
            return list(self.template.prompt_ids(messages, tools=self.tools))
        plain = [{k: v for k, v in m.items() if not k.endswith("token_ids")} for m in messages]
        return list(
            self.template.render(
                plain, tools=self.tools, add_generation_prompt=True, continue_final_message=False
            )
        )

    def message(
        self, text: str, prompt: list[int], generation: list[int], turn: int
    ) -> tuple[dict[str, Any], str | None, list[dict[str, Any]]]:
        """The assistant message NeMo Gym sends back next turn (parsed as vLLM parses the
        text), its reasoning, and its tool calls (OpenAI form, ids by turn)."""
        reasoning, content, calls = self.parsers.parse(
            text, tools=self.tools, tool_choice="auto" if self.tools else "none"
        )
        tool_calls = [
            {
                "id": f"c{turn}" if i == 0 else f"c{turn}_{i}",  # the first: the item's call_id
                "type": "function",
                "function": {"name": call.name, "arguments": call.arguments},
            }
            for i, call in enumerate(calls or [])
        ]
        message: dict[str, Any] = {
            "role": "assistant",
            "content": content or "",
            "prompt_token_ids": prompt,
            "generation_token_ids": generation,
        }
        if reasoning:
            message["reasoning_content"] = reasoning
        if tool_calls:
            message["tool_calls"] = tool_calls
        return message, reasoning, tool_calls


@st.composite
def _episodes(
    draw: st.DrawFn,
    play: _Play,
    min_turns: int,
    max_turns: int,
    rewards: st.SearchStrategy[float],
) -> Episode:
    messages: list[dict[str, Any]] = [{"role": "user", "content": draw(_text())}]
    prompts: list[list[int]] = []
    generations: list[list[int]] = []
    lps_per_turn: list[list[float]] = []
    drifts: list[tuple[int, DriftKind]] = []
    output: list[dict[str, Any]] = []
    reasoned = False
    turns = draw(st.integers(min_turns, max_turns))
    for turn in range(turns):
        prompt = play.prompt(messages, turn)
        if turn > 0:
            seen = prompts[-1] + generations[-1]
            if prompt[: len(seen)] != seen:
                kind = drift_kind(play.decode, prompts[-1], generations[-1], prompt, reasoned)
                drifts.append((turn, kind))
        text = draw(
            _assistant_text(
                reasons=play.parsers.reasoning is not None,
                calls=play.tools is not None and turn < turns - 1,
            )
        )
        generation = [*draw(_token_ids(play.template.encode, text)), play.eos]
        lps = draw(st.lists(play.logprobs, min_size=len(generation), max_size=len(generation)))
        message, reasoning, tool_calls = play.message(text, prompt, generation, turn)
        reasoned = bool(reasoning)
        messages.append(message)
        item_kind = "function_call" if tool_calls else "message"
        output.append(_model_item(item_kind, turn, prompt, generation, lps))
        for call in tool_calls:
            answer = draw(_text())
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": answer})
            output.append({"type": "function_call_output", "call_id": call["id"], "output": answer})
        if not tool_calls:
            messages.append({"role": "user", "content": draw(_text())})
        prompts.append(prompt)
        generations.append(generation)
        lps_per_turn.append(lps)
    reward = draw(rewards)
    first = messages[0]["content"]
    return _assemble(output, prompts, generations, lps_per_turn, drifts, reward, first)
