"""The HTTP server on 127.0.0.1: vLLM's routes and shapes, both modes, splice, errors."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import pytest
import requests

from nemogym_sdk.serve.engine import DEFAULT_SCRIPTED_ANSWER
from nemogym_sdk.serve.episodes import turn_seed
from nemogym_sdk.wire import EPISODE_ID

from .conftest import MODEL_NAME, TIME_TOOL, WEATHER_TOOL, make_server

pytest.importorskip("transformers")

EOS = 258
TRAINING = {"logprobs": True, "top_logprobs": 0, "return_tokens_as_token_ids": True}
START = [
    {"role": "developer", "content": "You are helpful."},
    {"role": "user", "content": "What's the weather and time in SF?"},
]


def chat(server: Any, **body: Any) -> dict[str, Any]:
    """POST a chat completion, assert 200, return the JSON."""
    response = requests.post(
        f"{server.base_url}/chat/completions", json={"model": MODEL_NAME, **body}, timeout=60
    )
    assert response.status_code == 200, response.text
    return dict(response.json())


def assistant_message(result: dict[str, Any]) -> dict[str, Any]:
    """The assistant message NeMo Gym's vllm_model sends back on the next turn (with token ids)."""
    choice = result["choices"][0]
    message = {k: choice["message"][k] for k in ("role", "content")}
    if choice["message"]["tool_calls"]:
        message["tool_calls"] = choice["message"]["tool_calls"]
    message["prompt_token_ids"] = result["prompt_token_ids"]
    message["generation_token_ids"] = choice["token_ids"]
    message["generation_log_probs"] = [e["logprob"] for e in choice["logprobs"]["content"]]
    return message


def test_health_models_and_openapi(scripted_server: Any) -> None:
    """/health is an empty 200; /v1/models lists the base model like vLLM; routes are advertised."""
    health = requests.get(f"{scripted_server.url}/health", timeout=10)
    assert health.status_code == 200 and health.content == b""
    models = requests.get(f"{scripted_server.base_url}/models", timeout=10).json()
    assert models["object"] == "list"
    (card,) = models["data"]
    assert (card["id"], card["object"], card["root"], card["parent"]) == (
        MODEL_NAME,
        "model",
        "nemogym-tiny",
        None,
    )
    assert card["max_model_len"] == 32768
    paths = requests.get(f"{scripted_server.url}/openapi.json", timeout=10).json()["paths"]
    assert {"/v1/chat/completions", "/v1/completions", "/tokenize", "/v1/load_lora_adapter"} <= set(
        paths
    )


def test_scripted_rollout_calls_each_tool_then_answers_token_exactly(scripted_server: Any) -> None:
    """Two tool turns rotating through the tools, then text; every prompt extends the last one."""
    tools = [WEATHER_TOOL, TIME_TOOL]
    messages: list[dict[str, Any]] = list(START)
    seen: list[int] = []
    results = []
    for turn in range(3):
        result = chat(
            scripted_server, messages=messages, tools=tools, return_token_ids=True, **TRAINING
        )
        choice = result["choices"][0]
        prompt, generated = result["prompt_token_ids"], choice["token_ids"]
        assert prompt[: len(seen)] == seen
        assert generated[-1] == EOS
        content = choice["logprobs"]["content"]
        assert [e["token"] for e in content] == [f"token_id:{t}" for t in generated]
        assert all(isinstance(e["logprob"], float) and e["logprob"] < 0 for e in content)
        assert all(e["top_logprobs"] == [] and isinstance(e["bytes"], list) for e in content)
        assert result["usage"]["prompt_tokens"] == len(prompt)
        assert result["usage"]["completion_tokens"] == len(generated)
        results.append(result)
        seen = prompt + generated
        messages.append(assistant_message(result))
        for call in choice["message"]["tool_calls"]:
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": "ok"})
        if turn == 2:
            messages.append({"role": "user", "content": "thanks"})

    first, second, third = (r["choices"][0] for r in results)
    assert first["finish_reason"] == second["finish_reason"] == "tool_calls"
    assert first["message"]["content"] is None
    assert first["message"]["tool_calls"][0]["function"] == {
        "name": "get_weather",
        "arguments": '{"city": "example city"}',
    }
    assert second["message"]["tool_calls"][0]["function"]["name"] == "get_time"
    assert json.loads(second["message"]["tool_calls"][0]["function"]["arguments"]) == {
        "zone": "UTC",
        "hour24": True,
    }
    assert third["finish_reason"] == "stop" and third["message"]["tool_calls"] == []
    assert third["message"]["content"] == DEFAULT_SCRIPTED_ANSWER
    # after the answer the conversation continues with a fresh answer (tool turns used up)
    fourth = chat(scripted_server, messages=messages, tools=tools, **TRAINING)
    assert fourth["choices"][0]["message"]["content"] == DEFAULT_SCRIPTED_ANSWER


def test_tokenize_applies_the_same_splice_as_generation(scripted_server: Any) -> None:
    """Without return_token_ids the ids are null; /tokenize gives the prompt vllm_model needs."""
    first = chat(
        scripted_server, messages=START, tools=[WEATHER_TOOL], return_token_ids=True, **TRAINING
    )
    call = first["choices"][0]["message"]["tool_calls"][0]
    messages = [
        *START,
        assistant_message(first),
        {"role": "tool", "tool_call_id": call["id"], "content": '{"weather": "cold"}'},
    ]
    second = chat(scripted_server, messages=messages, tools=[WEATHER_TOOL], **TRAINING)
    assert second["prompt_token_ids"] is None and second["choices"][0]["token_ids"] is None
    with_ids = chat(
        scripted_server, messages=messages, tools=[WEATHER_TOOL], return_token_ids=True, **TRAINING
    )
    tokenized = requests.post(
        f"{scripted_server.url}/tokenize",
        json={"model": MODEL_NAME, "messages": messages, "tools": [WEATHER_TOOL]},
        timeout=30,
    ).json()
    assert tokenized["tokens"] == with_ids["prompt_token_ids"]
    assert tokenized["count"] == len(tokenized["tokens"])
    assert tokenized["max_model_len"] == 32768 and tokenized["token_strs"] is None
    assert second["choices"][0]["token_ids"] is None
    assert [e["token"] for e in second["choices"][0]["logprobs"]["content"]] == [
        e["token"] for e in with_ids["choices"][0]["logprobs"]["content"]
    ]


def test_tokenize_plain_prompt(scripted_server: Any) -> None:
    """The completion form tokenizes text (one id per byte for the tiny tokenizer)."""
    body = requests.post(
        f"{scripted_server.url}/tokenize",
        json={"prompt": "hé", "return_token_strs": True},
        timeout=10,
    ).json()
    assert body["tokens"] == [104, 195, 169] and body["count"] == 3
    assert len(body["token_strs"]) == 3


def test_scripted_mode_without_tools_or_with_tool_choice(scripted_server: Any) -> None:
    """No tools or tool_choice "none": text; a named tool_choice forces that tool every turn."""
    plain = chat(scripted_server, messages=START)["choices"][0]
    assert plain["message"]["content"] == DEFAULT_SCRIPTED_ANSWER
    assert plain["logprobs"] is None and plain["finish_reason"] == "stop"
    none = chat(scripted_server, messages=START, tools=[WEATHER_TOOL], tool_choice="none")
    assert none["choices"][0]["message"]["tool_calls"] == []
    named = {"type": "function", "function": {"name": "get_time"}}
    forced = chat(
        scripted_server, messages=START, tools=[WEATHER_TOOL, TIME_TOOL], tool_choice=named
    )
    assert forced["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "get_time"


def test_max_tokens_cuts_scripted_text_and_leaves_it_as_content(scripted_server: Any) -> None:
    """max_tokens=5 cuts the tool call after "<tool": finish "length", no tool call, 5 logprobs."""
    result = chat(
        scripted_server,
        messages=START,
        tools=[WEATHER_TOOL],
        max_tokens=5,
        return_token_ids=True,
        **TRAINING,
    )
    choice = result["choices"][0]
    assert choice["finish_reason"] == "length"
    assert choice["message"]["content"] == "<tool"
    assert choice["message"]["tool_calls"] == []
    assert len(choice["token_ids"]) == len(choice["logprobs"]["content"]) == 5


def test_top_logprobs_and_text_tokens(scripted_server: Any) -> None:
    """Without token-id spelling, tokens are text; top_logprobs=2 gives two sorted alternatives."""
    result = chat(scripted_server, messages=START, logprobs=True, top_logprobs=2)
    content = result["choices"][0]["logprobs"]["content"]
    assert "".join(e["token"] for e in content[:-1]) == DEFAULT_SCRIPTED_ANSWER
    assert content[-1]["token"] == "<|im_end|>"
    for entry in content:
        alternatives = [a["logprob"] for a in entry["top_logprobs"]]
        assert len(alternatives) == 2 and alternatives == sorted(alternatives, reverse=True)


def test_sample_mode_is_seeded_and_splices_arbitrary_generations(sample_server: Any) -> None:
    """Same seed, same tokens; a random (maybe invalid UTF-8) turn still extends token-exactly."""
    body = {"messages": START, "max_tokens": 24, "seed": 7, "return_token_ids": True, **TRAINING}
    first, again = chat(sample_server, **body), chat(sample_server, **body)
    assert first["choices"][0]["token_ids"] == again["choices"][0]["token_ids"]
    assert [e["logprob"] for e in first["choices"][0]["logprobs"]["content"]] == [
        e["logprob"] for e in again["choices"][0]["logprobs"]["content"]
    ]
    other = chat(sample_server, **{**body, "seed": 8})
    assert other["choices"][0]["token_ids"] != first["choices"][0]["token_ids"]
    messages = [*START, assistant_message(first), {"role": "user", "content": "go on"}]
    second = chat(sample_server, **{**body, "messages": messages})
    seen = first["prompt_token_ids"] + first["choices"][0]["token_ids"]
    assert second["prompt_token_ids"][: len(seen)] == seen
    tokenized = requests.post(
        f"{sample_server.url}/tokenize", json={"messages": messages}, timeout=30
    ).json()
    assert tokenized["tokens"] == second["prompt_token_ids"]


def test_the_turns_of_a_seeded_episode_draw_apart_and_replay(sample_server: Any) -> None:
    """A turn of an episode (``EPISODE_ID``) samples with its seed mixed with its prompt's
    length (``turn_seed``): the episode's turns, which share the seed, draw from streams of
    their own, and a turn sent again draws the same tokens."""
    episode = "seeds.jsonl:0#1#ab"
    body = {"messages": START, "max_tokens": 24, "seed": 7, "return_token_ids": True, **TRAINING}
    first = chat(sample_server, **body, **{EPISODE_ID: episode})
    again = chat(sample_server, **body, **{EPISODE_ID: episode})
    assert again["choices"][0]["token_ids"] == first["choices"][0]["token_ids"]
    later = [*START, assistant_message(first), {"role": "user", "content": "go on"}]
    second = chat(sample_server, **{**body, "messages": later, EPISODE_ID: episode})
    for turn, messages in ((first, START), (second, later)):
        mixed = turn_seed(7, episode, len(turn["prompt_token_ids"]))
        assert mixed is not None and mixed != 7
        tokens = turn["choices"][0]["token_ids"]
        as_sent = chat(sample_server, **{**body, "messages": messages})  # no episode: seed 7
        assert as_sent["choices"][0]["token_ids"] != tokens
        drawn = chat(sample_server, **{**body, "messages": messages, "seed": mixed})
        assert drawn["choices"][0]["token_ids"] == tokens


def test_errors_are_vllm_shaped(scripted_server: Any) -> None:
    """Unknown model 404; context overflow, bad JSON, n=2 and broken token ids are 400s."""
    url = f"{scripted_server.base_url}/chat/completions"
    missing = requests.post(url, json={"model": "nope", "messages": START}, timeout=10)
    assert missing.status_code == 404
    assert missing.json() == {
        "error": {
            "message": "The model `nope` does not exist.",
            "type": "NotFoundError",
            "param": "model",
            "code": 404,
        }
    }
    too_long = requests.post(
        url,
        json={"model": MODEL_NAME, "messages": [{"role": "user", "content": "x" * 33000}]},
        timeout=30,
    )
    assert too_long.status_code == 400
    assert "maximum context length" in too_long.json()["error"]["message"]
    too_many = requests.post(
        url, json={"model": MODEL_NAME, "messages": START, "max_tokens": 40000}, timeout=30
    )
    assert too_many.status_code == 400 and "context length" in too_many.text
    not_json = requests.post(url, data=b"{nope", timeout=10)
    assert not_json.status_code == 400 and not_json.json()["error"]["type"] == "BadRequestError"
    two = requests.post(url, json={"model": MODEL_NAME, "messages": START, "n": 2}, timeout=10)
    assert two.status_code == 400
    broken = [*START, {"role": "assistant", "content": "x", "prompt_token_ids": [1]}]
    half = requests.post(url, json={"model": MODEL_NAME, "messages": broken}, timeout=10)
    assert half.status_code == 400 and "generation_token_ids" in half.json()["error"]["message"]
    tokenize = requests.post(
        f"{scripted_server.url}/tokenize", json={"model": "nope", "prompt": "a"}, timeout=10
    )
    assert tokenize.status_code == 404


def test_health_stays_responsive_during_a_long_generation(sample_server: Any) -> None:
    """Model work runs off the event loop: /health answers while a long request generates."""
    done: dict[str, Any] = {}

    def long_request() -> None:
        done["result"] = chat(
            sample_server, messages=START, max_tokens=800, ignore_eos=True, temperature=0.0
        )

    worker = threading.Thread(target=long_request)
    worker.start()
    time.sleep(0.2)
    latencies: list[float] = []
    while worker.is_alive() and len(latencies) < 5:
        began = time.monotonic()
        assert requests.get(f"{sample_server.url}/health", timeout=10).status_code == 200
        latencies.append(time.monotonic() - began)
        time.sleep(0.05)
    worker.join(timeout=120)
    assert latencies, "the generation finished before /health could be probed"
    assert max(latencies) < 1.0
    assert done["result"]["usage"]["completion_tokens"] == 800
    assert done["result"]["choices"][0]["finish_reason"] == "length"


def test_concurrent_requests_are_batched_and_all_answered(sample_server: Any) -> None:
    """Eight concurrent seeded requests all succeed and match their sequential answers."""
    bodies = [
        {"messages": START, "max_tokens": 8, "seed": s, "return_token_ids": True} for s in range(8)
    ]
    results: dict[int, list[int]] = {}

    def run(index: int) -> None:
        results[index] = chat(sample_server, **bodies[index])["choices"][0]["token_ids"]

    threads = [threading.Thread(target=run, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert sorted(results) == list(range(8))
    for index in (0, 5):
        assert chat(sample_server, **bodies[index])["choices"][0]["token_ids"] == results[index]


def test_token_in_completions_sample_what_chat_samples_in_vllms_shape(sample_server: Any) -> None:
    """``POST /v1/completions`` with the prompt as token ids (what the proxy in front of a
    router sends each replica) samples exactly what a chat request with the same prompt
    and seed samples, and its answer passes the proxy's own parser of vLLM's answers."""
    from nemogym_sdk.serve.vllm_backend import parse_completion

    chatted = chat(
        sample_server, messages=START, seed=7, max_tokens=6, return_token_ids=True, **TRAINING
    )
    chatted |= {"token_ids": chatted["choices"][0]["token_ids"]}
    prompt = chatted["prompt_token_ids"]
    body = {
        "model": MODEL_NAME,
        "prompt": prompt,
        "seed": 7,
        "max_tokens": 6,
        "logprobs": 2,
        "return_token_ids": True,
        "return_tokens_as_token_ids": True,
    }
    response = requests.post(f"{sample_server.base_url}/completions", json=body, timeout=60)
    assert response.status_code == 200, response.text
    answer = response.json()
    assert answer["object"] == "text_completion"
    choice = answer["choices"][0]
    assert choice["prompt_token_ids"] == prompt and choice["token_ids"] == chatted["token_ids"]
    generation = parse_completion(answer, prompt, token_text=str, top_logprobs=2)
    chat_logprobs = [e["logprob"] for e in chatted["choices"][0]["logprobs"]["content"]]
    assert [t.logprob for t in generation.tokens] == pytest.approx(chat_logprobs, abs=1e-6)
    assert all(len(t.top) == 2 for t in generation.tokens)
    bad = requests.post(
        f"{sample_server.base_url}/completions", json={**body, "prompt": []}, timeout=10
    )
    assert bad.status_code == 400 and "prompt" in bad.json()["error"]["message"]


def test_a_server_without_a_tool_parser_refuses_a_tool_choice_as_vllm_does() -> None:
    """``--tool-call-parser none``: tools with ``auto`` (their default) are a 400 in vLLM's
    words, so NeMo Gym meets the same answer as from vLLM started without tool parsing."""
    from nemogym_sdk.serve.parsers import OutputParsers

    server = make_server("sample", parsers=OutputParsers(tool_calls=None))
    try:
        url = f"{server.base_url}/chat/completions"
        body = {"model": MODEL_NAME, "messages": START, "max_tokens": 4}
        refused = requests.post(url, json={**body, "tools": [WEATHER_TOOL]}, timeout=60)
        assert refused.status_code == 400
        assert "requires --enable-auto-tool-choice" in refused.json()["error"]["message"]
        none = {**body, "tools": [WEATHER_TOOL], "tool_choice": "none"}
        assert requests.post(url, json=none, timeout=60).status_code == 200
    finally:
        server.stop()
