"""Scripted answers chosen by rules: matching, file errors, and the server answering by them."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import requests

from nemogym_sdk.serve.__main__ import build_parser, main
from nemogym_sdk.serve.script import DEFAULT_SCRIPTED_ANSWER, Script, message_text

from .conftest import MODEL_NAME, WEATHER_TOOL

GAME = {
    "default": "plain text",
    "rules": [
        {"match": r"<action>(Up|Down)</action>", "answer": "<action>Up</action>"},
        {"match": r"(?s)Judge.*one JSON object", "answer": '{"verdict": "yes"}'},
        {"match": r"action", "answer": "never reached for a game prompt"},
        {"last_role": "assistant", "answer": "Response Safety: safe"},
    ],
}


def test_first_matching_rule_wins_over_all_messages_and_text_parts() -> None:
    """Rules are tried in order against every message's text; no match gives the default."""
    script = Script.from_json(GAME)
    game = [
        {"role": "system", "content": "Play Sokoban."},
        {"role": "user", "content": [{"type": "text", "text": "Reply <action>Up</action>."}]},
    ]
    assert script.answer(game) == "<action>Up</action>"
    judge = [
        {"role": "system", "content": "You are the Judge."},
        {"role": "user", "content": "Reply with exactly one JSON object."},
    ]
    assert script.answer(judge) == '{"verdict": "yes"}'
    assert script.answer([{"role": "user", "content": "take an action"}]) == (
        "never reached for a game prompt"
    )
    assert script.answer([{"role": "user", "content": "hello"}]) == "plain text"
    continued = [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi"}]
    assert script.answer(continued) == "Response Safety: safe"
    assert Script().answer(game) == DEFAULT_SCRIPTED_ANSWER
    assert message_text([{"content": None}, {"content": [{"type": "image"}]}, {}]) == ""


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ([], "expected a JSON object, got list"),
        ({"rules": [], "fallback": "x"}, "unknown keys ['fallback']"),
        ({"default": 3}, "'default' must be a string"),
        ({"rules": {"match": "a"}}, "'rules' must be a list"),
        ({"rules": [{"match": "a"}]}, "rules[0] must be an object with 'answer' and"),
        ({"rules": [{"answer": "a"}]}, "rules[0] must be an object with 'answer' and"),
        ({"rules": [{"answer": "a", "role": "user"}]}, "rules[0] must be an object"),
        ({"rules": [{"match": "a", "answer": "b"}, {"match": "(", "answer": "c"}]}, "rules[1]"),
        ({"rules": [{"match": "a", "answer": 1}]}, "'match', 'answer' must be strings"),
    ],
)
def test_bad_scripts_name_what_is_wrong(data: Any, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        Script.from_json(data)


def test_cli_loads_a_script_file_and_rejects_bad_ones(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--scripted-answers reads JSON; a bad file exits 2 naming the file; one answer flag only."""
    good = tmp_path / "answers.json"
    good.write_text(json.dumps(GAME))
    assert Script.from_file(good).rules[0].answer == "<action>Up</action>"
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert main(["--scripted-answers", str(bad)]) == 2
    assert f"{bad}: not valid JSON" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--scripted-answer", "a", "--scripted-answers", str(good)])


def test_server_answers_by_the_script_after_its_tool_turns() -> None:
    """Tool turns come first; then the rule's text, forced and scored token by token."""
    pytest.importorskip("transformers")
    from nemogym_sdk.serve import CausalLMBackend, ServeEngine, ServerThread

    backend = CausalLMBackend.tiny(0)
    engine = ServeEngine(
        backend,
        served_model_name=MODEL_NAME,
        scripted_tool_turns=1,
        scripted_answer=Script.from_json(GAME),
    )
    with ServerThread(engine) as server:

        def chat(messages: list[dict[str, Any]], **body: Any) -> dict[str, Any]:
            response = requests.post(
                f"{server.base_url}/chat/completions",
                json={"model": MODEL_NAME, "messages": messages, "logprobs": True, **body},
                timeout=60,
            )
            assert response.status_code == 200, response.text
            return dict(response.json()["choices"][0])

        game = [{"role": "user", "content": "Answer <action>Down</action> or similar."}]
        first = chat(game, tools=[WEATHER_TOOL])
        assert first["message"]["tool_calls"][0]["function"]["name"] == "get_weather"
        answer = chat(game)
        assert answer["message"]["content"] == "<action>Up</action>"
        tokens = answer["logprobs"]["content"]
        assert len(tokens) == len(backend.encode("<action>Up</action>")) + 1  # + EOS
        assert all(t["logprob"] <= 0.0 for t in tokens)
        other = chat([{"role": "user", "content": "hi"}])
        assert other["message"]["content"] == "plain text"
