"""Scripted conversations in which a family's model reasons, calls tools and answers.

A random model almost never writes ``<think>`` blocks or tool-call markup, so the episodes
where templates and parsers matter would not occur. `lessons` draws conversations like the
ones NeMo Gym's shipped tool environments hold (``example_single_tool_call``'s
``get_weather``, ``example_multi_step``'s synonym tools) and plain questions, with random
filler text, and spells the assistant turn each should end with as the family writes it:
`Lesson.completion` is exactly the text the model must generate after the generation
prompt, ``<think>`` block, tool-call markup and EOS included
(`nemogym_sdk.serve.families.teach` trains on it).
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from typing import Any

import attrs

from nemogym_sdk.serve.families.family import Family

__all__ = ["SYNONYM_TOOLS", "WEATHER_TOOL", "Lesson", "lessons"]


def _tool(name: str, description: str, properties: dict[str, Any]) -> dict[str, Any]:
    parameters = {
        "type": "object",
        "properties": properties,
        "required": list(properties),
        "additionalProperties": False,
    }
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": parameters,
            "strict": True,
        },
    }


WEATHER_TOOL = _tool("get_weather", "", {"city": {"type": "string", "description": ""}})
"""``example_single_tool_call``'s tool, as NeMo Gym's ``vllm_model`` offers it."""
SYNONYM_TOOLS = (
    _tool(
        "get_synonym_value",
        "Get the synonym value for a synonym.",
        {"synonym": {"type": "string", "title": "Synonym"}},
    ),
    _tool(
        "extract_synonym_values",
        "Extract the synonym values you retrieved for the term that is relevant to the query.",
        {"synonym_values": {"items": {"type": "integer"}, "type": "array"}},
    ),
)
"""``example_multi_step``'s tools (descriptions shortened)."""

_WORDS = (  # noqa: SIM905  (a list literal would take 33 lines)
    "weather city region heat dry wind storm night light open far early quiet rough term "
    "value answer please tell me about what how why the a of in and is it like today"
).split()


@attrs.frozen
class Lesson:
    """One conversation and the assistant text that should follow it."""

    messages: tuple[dict[str, Any], ...]
    tools: tuple[dict[str, Any], ...] | None
    prompt: str
    """The rendered conversation with the generation prompt."""
    completion: str
    """What the model should generate after ``prompt``, its EOS included."""


def _filler(rng: random.Random, low: int, high: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(rng.randint(low, high)))


def _call(name: str, arguments: dict[str, Any], index: int) -> dict[str, Any]:
    # decoded, as vLLM (and nemogym_sdk.serve.chat) hand arguments to templates
    function = {"name": name, "arguments": arguments}
    return {"id": f"call_{index}", "type": "function", "function": function}


_PLAIN = ("plain", "plain-again")
_WITH_TOOLS = ("weather", "weather-answer", "syn", "syn-next", "syn-done")


def _answer(rng: random.Random) -> dict[str, Any]:
    return {"role": "assistant", "content": rng.choice(("Hello there.", "Yes.", "It is."))}


def _scenario(
    rng: random.Random, tools_too: bool
) -> tuple[list[dict[str, Any]], Any, dict[str, Any]]:
    """(history, tools, the assistant turn to learn) of one random scenario; a plain
    question (answered once before, or not), or a step of a tool episode."""
    system = [{"role": "system", "content": _filler(rng, 4, 30)}] if rng.random() < 0.7 else []
    user = {"role": "user", "content": _filler(rng, 3, 12) + "?"}
    kind = rng.choice(_PLAIN + _WITH_TOOLS if tools_too else _PLAIN)
    if kind == "plain":
        return [*system, user], None, _answer(rng)
    if kind == "plain-again":
        again = {"role": "user", "content": _filler(rng, 2, 8) + "?"}
        return [*system, user, _answer(rng), again], None, _answer(rng)
    steps: list[tuple[str, dict[str, Any], str]]
    if kind.startswith("weather"):
        tools: Any = [WEATHER_TOOL]
        steps = [("get_weather", {"city": "San Francisco"}, _filler(rng, 1, 4))]
        final = "It is " + rng.choice(("sunny", "cold", "windy")) + "."
    else:
        tools = list(SYNONYM_TOOLS)
        value = rng.randint(100, 999)
        steps = [
            ("get_synonym_value", {"synonym": "Arid"}, json.dumps({"synonym_value": value})),
            # a fixed list: a 2-layer model does not copy numbers reliably
            ("extract_synonym_values", {"synonym_values": [711]}, '{"success": true}'),
        ]
        final = "Done."
    done = {"weather": 0, "weather-answer": 1, "syn": 0, "syn-next": 1, "syn-done": 2}[kind]
    history: list[dict[str, Any]] = [*system, user]
    for index, (name, arguments, result) in enumerate(steps[:done]):
        history.append(
            {"role": "assistant", "content": "", "tool_calls": [_call(name, arguments, index)]}
        )
        history.append({"role": "tool", "tool_call_id": f"call_{index}", "content": result})
    turn: dict[str, Any]
    if done < len(steps):
        name, arguments, _ = steps[done]
        turn = {"role": "assistant", "content": "", "tool_calls": [_call(name, arguments, done)]}
    else:
        turn = {"role": "assistant", "content": final}
    return history, tools, turn


_REASONING = "Let me see."
_R1_ASSISTANT = "<\uff5cAssistant\uff5c>"
"""DeepSeek's assistant marker (fullwidth bars)."""


def _with_reasoning(family: Family, turn: dict[str, Any]) -> dict[str, Any]:
    if family.reasoning_parser is None:
        return turn
    return {**turn, "reasoning_content": _REASONING}


def completion_of(
    family: Family, tokenizer: Any, history: Sequence[dict[str, Any]], tools: Any, turn: Any
) -> tuple[str, str]:
    """(prompt, completion): the rendered history with its generation prompt, and the text
    the model writes for ``turn`` after it, up to and including the family's EOS."""

    def render(messages: Sequence[dict[str, Any]], prompt: bool) -> str:
        text = tokenizer.apply_chat_template(
            list(messages), tools=tools, tokenize=False, add_generation_prompt=prompt
        )
        return str(text)

    prompt = render(history, True)
    full = render([*history, turn], False)
    if full.startswith(prompt):
        completion = full[len(prompt) :]
    else:  # the template re-renders even this turn without its reasoning (deepseek-r1)
        if not prompt.endswith("<think>\n"):
            raise ValueError(f"{family.name}: cannot spell a completion from its template")
        turn_text = full[len(render(history, False)) :]  # DeepSeek's assistant marker, answer, EOS
        answer = turn_text.split(family.eos_token)[0].removeprefix(_R1_ASSISTANT)
        reasoning = turn.get("reasoning_content", "")
        completion = f"{reasoning}\n</think>\n\n{answer}{family.eos_token}"
    end = completion.find(family.eos_token)
    if end < 0:
        raise ValueError(f"{family.name}: the rendered turn has no {family.eos_token!r}")
    return prompt, completion[: end + len(family.eos_token)]


def lessons(family: Family, tokenizer: Any, count: int, seed: int = 0) -> list[Lesson]:
    """``count`` random lessons for ``family`` (deterministic from ``seed``)."""
    rng = random.Random(seed)
    drawn = []
    for _ in range(count):
        history, tools, turn = _scenario(rng, family.tool_call_parser is not None)
        if family.reasoning_parser is not None:
            history = [
                _with_reasoning(family, m) if m["role"] == "assistant" else m for m in history
            ]
        turn = _with_reasoning(family, turn)
        prompt, completion = completion_of(family, tokenizer, history, tools, turn)
        drawn.append(
            Lesson(
                messages=tuple(history),
                tools=tuple(tools) if tools else None,
                prompt=prompt,
                completion=completion,
            )
        )
    return drawn
