"""What the scripted policy answers: one default text, or that of the first rule that matches.

Scripted mode answers every conversation with the same text by default. An environment that
parses its answers (an ``<action>`` tag, a JSON verdict from a judge) rejects that text, so a
CPU run could not tell "this environment works" from "this environment rejects free text".
A `Script` names, per kind of request, the text to answer instead:

    {
      "default": "I have everything I need. Done.",
      "rules": [
        {"match": "You are performing the Answer Check", "answer": "{\\"verdict\\": \\"yes\\"}"},
        {"match": "(?m)^Sokoban board:$", "answer": "<action>Up</action>"},
        {"last_role": "assistant", "answer": "Response Safety: safe"}
      ]
    }

``match`` is a Python regular expression searched in the request's message text (every
message's text content, joined with newlines, in order); ``last_role`` is the role the
conversation's last message must have (a judge asked to continue a policy's answer). A rule
gives one or both; the first rule whose conditions all hold wins. A judge's prompt often
quotes the policy's, so judge rules go first. Rules choose the text answer only: tool calls
still come first for the configured number of turns. ``python -m nemogym_sdk.serve
--scripted-answers FILE`` loads one from a JSON file.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from nemogym_sdk.errors import ConfigError

__all__ = ["DEFAULT_SCRIPTED_ANSWER", "Script", "ScriptRule", "message_text"]

DEFAULT_SCRIPTED_ANSWER = "I have everything I need. Done."


@attrs.frozen
class ScriptRule:
    """Answer ``answer`` to a conversation whose message text matches ``pattern`` and whose
    last message has role ``last_role`` (``None``: any)."""

    answer: str
    pattern: re.Pattern[str] | None = None
    last_role: str | None = None

    def matches(self, messages: Sequence[Mapping[str, Any]], text: str) -> bool:
        """Whether this rule answers ``messages`` (``text``: their `message_text`)."""
        if self.last_role is not None and (
            not messages or messages[-1].get("role") != self.last_role
        ):
            return False
        return self.pattern is None or self.pattern.search(text) is not None


@attrs.frozen
class Script:
    """The scripted policy's text answers: ``rules`` in order, else ``default``."""

    default: str = DEFAULT_SCRIPTED_ANSWER
    rules: tuple[ScriptRule, ...] = ()

    def answer(self, messages: Sequence[Mapping[str, Any]]) -> str:
        """The text to answer to ``messages``."""
        if self.rules:
            text = message_text(messages)
            for rule in self.rules:
                if rule.matches(messages, text):
                    return rule.answer
        return self.default

    @classmethod
    def from_json(cls, data: Any, *, where: str = "script") -> Script:
        """Build from ``{"default": str, "rules": [{"match": regex, "last_role": role,
        "answer": str}, ...]}`` (see the module docstring).

        Both keys are optional. ``ConfigError`` (a ``ValueError``) names the entry that is wrong.
        """
        if not isinstance(data, Mapping):
            raise ConfigError(f"{where}: expected a JSON object, got {type(data).__name__}")
        unknown = sorted(set(data) - {"default", "rules"})
        if unknown:
            raise ConfigError(f"{where}: unknown keys {unknown}; expected 'default' and 'rules'")
        default = data.get("default", DEFAULT_SCRIPTED_ANSWER)
        if not isinstance(default, str):
            raise ConfigError(f"{where}: 'default' must be a string")
        rules = data.get("rules", [])
        if not isinstance(rules, list):
            raise ConfigError(f"{where}: 'rules' must be a list")
        return cls(default=default, rules=tuple(_rules(rules, where)))

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> Script:
        """Read a JSON script file (see the module docstring)."""
        text = Path(path).read_text()
        try:
            data = json.loads(text)
        except json.JSONDecodeError as error:
            raise ConfigError(f"{path}: not valid JSON: {error}") from None
        return cls.from_json(data, where=str(path))


_RULE_KEYS = frozenset({"match", "last_role", "answer"})


def _rules(entries: Iterable[Any], where: str) -> Iterable[ScriptRule]:
    for index, entry in enumerate(entries):
        here = f"{where}: rules[{index}]"
        if (
            not isinstance(entry, Mapping)
            or "answer" not in entry
            or not set(entry) & {"match", "last_role"}
            or set(entry) - _RULE_KEYS
        ):
            raise ConfigError(
                f"{here} must be an object with 'answer' and 'match', 'last_role' or both"
            )
        if not all(isinstance(value, str) for value in entry.values()):
            raise ConfigError(f"{here}: {', '.join(map(repr, entry))} must be strings")
        pattern = None
        if "match" in entry:
            try:
                pattern = re.compile(entry["match"])
            except re.error as error:
                raise ConfigError(f"{here}: 'match' is not a valid regex: {error}") from None
        yield ScriptRule(answer=entry["answer"], pattern=pattern, last_role=entry.get("last_role"))


def message_text(messages: Sequence[Mapping[str, Any]]) -> str:
    """Every message's text content (strings and ``text`` parts), joined with newlines."""
    texts: list[str] = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, str):
            texts.append(content)
        elif isinstance(content, list):
            texts.extend(
                str(part["text"])
                for part in content
                if isinstance(part, Mapping) and isinstance(part.get("text"), str)
            )
    return "\n".join(texts)
