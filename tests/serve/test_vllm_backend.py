"""The vLLM backend against a fake vLLM server: prompts spliced here, token ids to and fro.

The fake (``fake_vllm.py``) answers with vLLM 0.32's shapes; real vLLM is in
``test_vllm_real.py``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

pytest.importorskip("transformers")

from nemogym_sdk.serve import ServeEngine, ServerThread
from nemogym_sdk.serve.errors import BadGatewayError
from nemogym_sdk.serve.protocol import RequestSampling
from nemogym_sdk.serve.record import SamplingRecorder, read_records, turn_key
from nemogym_sdk.serve.template import ChatTemplate
from nemogym_sdk.serve.tiny import build_tiny_tokenizer
from nemogym_sdk.serve.vllm_backend import VllmBackend, completion_request, parse_completion

from .conftest import WEATHER_TOOL
from .fake_vllm import EOS, FakeVllm

CALL_TEXT = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


@pytest.fixture(scope="module")
def template() -> ChatTemplate:
    return ChatTemplate(build_tiny_tokenizer(), eos_token_ids={EOS}, name="tiny")


def _proxy(
    template: ChatTemplate, fake: FakeVllm, *, recorder: SamplingRecorder | None = None, **kw: Any
) -> ServerThread:
    backend = VllmBackend(template, fake.base_url, name_or_path="/m", connect_wait=2.0)
    engine = ServeEngine(backend, mode="sample", recorder=recorder, **kw)
    return ServerThread(engine).start()


@pytest.fixture
def fake(template: ChatTemplate) -> Iterator[FakeVllm]:
    with FakeVllm([*template.encode(CALL_TEXT), EOS]) as server:
        yield server


def _chat(server: ServerThread, **body: Any) -> requests.Response:
    payload = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "Weather in Paris?"}],
        "logprobs": True,
        "top_logprobs": 0,
        "return_tokens_as_token_ids": True,
        "return_token_ids": True,
        **body,
    }
    return requests.post(f"{server.base_url}/chat/completions", json=payload, timeout=30)


def test_completion_request_carries_token_ids_and_every_sampling_param() -> None:
    """The body sent to vLLM: the prompt as ids, the request's sampling, token ids back."""
    params = RequestSampling(
        max_tokens=7, temperature=0.7, top_p=0.9, top_k=5, stop=("\n",), stop_token_ids=(9,)
    )
    body = completion_request([1, 2, 3], params, model="policy", seed=11, max_tokens=7)
    assert body == {
        "model": "policy",
        "prompt": [1, 2, 3],
        "max_tokens": 7,
        "temperature": 0.7,
        "top_p": 0.9,
        "top_k": 5,
        "seed": 11,
        "stop": ["\n"],
        "stop_token_ids": [9],
        "logprobs": 0,
        "return_token_ids": True,
        "return_tokens_as_token_ids": True,
    }


def _answer(token_ids: list[int], spelled: list[str], values: list[float]) -> dict[str, Any]:
    logprobs = {"tokens": spelled, "token_logprobs": values, "top_logprobs": None}
    choice = {"token_ids": token_ids, "logprobs": logprobs, "finish_reason": "length"}
    return {"choices": [{**choice, "prompt_token_ids": [5], "stop_reason": None}]}


def test_parse_completion_takes_the_sampled_tokens_logprobs() -> None:
    """Tokens 7, 8 with logprobs -0.5, -1.5: exactly those, in order, finish length."""
    answer = _answer([7, 8], ["token_id:7", "token_id:8"], [-0.5, -1.5])
    generation = parse_completion(answer, [5], token_text=str)
    assert generation.token_ids == [7, 8]
    assert [t.logprob for t in generation.tokens] == [-0.5, -1.5]
    assert generation.finish_reason == "length"


@pytest.mark.parametrize(
    ("answer", "prompt", "match"),
    [
        (_answer([7], ["token_id:9"], [-0.5]), [5], "not the sampled token"),
        (_answer([7], ["token_id:7"], [-0.5, -1.0]), [5], "different lengths"),
        (_answer([7], ["7"], [-0.5]), [5], "token_id"),
        (_answer([7], ["token_id:7"], [-0.5]), [6], "other prompt ids"),
        ({"choices": [{"text": "x"}]}, [5], "lacks token ids"),
    ],
)
def test_parse_completion_rejects_inconsistent_answers(
    answer: dict[str, Any], prompt: list[int], match: str
) -> None:
    """Any answer that would misalign tokens and logprobs is a 502, never a silent fix."""
    with pytest.raises(BadGatewayError, match=match):
        parse_completion(answer, prompt, token_text=str)


def test_chat_sends_local_prompt_ids_and_parses_the_tool_call(
    fake: FakeVllm, template: ChatTemplate
) -> None:
    """vLLM gets our rendered ids; the answer has its ids, logprobs and the parsed call."""
    with _proxy(template, fake) as server:
        response = _chat(server, tools=[WEATHER_TOOL], temperature=0.7, top_p=0.9, seed=3)
    assert response.status_code == 200, response.text
    body = response.json()
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    expected_prompt = template.render(
        messages, tools=[WEATHER_TOOL], add_generation_prompt=True, continue_final_message=False
    )
    assert body["prompt_token_ids"] == expected_prompt
    assert body["choices"][0]["token_ids"] == fake.script
    content = body["choices"][0]["logprobs"]["content"]
    assert [c["token"] for c in content] == [f"token_id:{t}" for t in fake.script]
    assert [c["logprob"] for c in content] == [-0.25 * (i + 1) for i in range(len(fake.script))]
    message = body["choices"][0]["message"]
    assert body["choices"][0]["finish_reason"] == "tool_calls"
    assert [c["function"]["name"] for c in message["tool_calls"]] == ["get_weather"]
    assert json.loads(message["tool_calls"][0]["function"]["arguments"]) == {"city": "Paris"}
    (sent,) = fake.completions()
    assert sent["prompt"] == expected_prompt
    assert sent["model"] == "tiny"
    assert (sent["temperature"], sent["top_p"], sent["seed"]) == (0.7, 0.9, 3)
    assert sent["max_tokens"] == 2048 - len(expected_prompt)


def test_second_turn_prompt_starts_with_the_models_own_tokens(
    fake: FakeVllm, template: ChatTemplate
) -> None:
    """Turn 1 generated bytes 0xC3 0x28 (invalid UTF-8) then EOS; turn 2's prompt keeps them.

    prompt₁ = P, generation₁ = [195, 40, 258]; re-rendering the decoded text would give
    U+FFFD bytes instead, so vLLM must receive P + [195, 40, 258] + template glue.
    """
    first = template.render(
        [{"role": "user", "content": "hi"}],
        tools=None,
        add_generation_prompt=True,
        continue_final_message=False,
    )
    generation = [195, 40, EOS]
    messages = [
        {"role": "user", "content": "hi"},
        {
            "role": "assistant",
            "content": template.decode(generation),
            "prompt_token_ids": first,
            "generation_token_ids": generation,
            "generation_log_probs": [-1.0, -1.0, -1.0],
        },
        {"role": "user", "content": "again"},
    ]
    with _proxy(template, fake) as server:
        response = _chat(server, messages=messages, max_tokens=4)
        tokenized = requests.post(
            f"{server.url}/tokenize", json={"model": "tiny", "messages": messages}, timeout=30
        ).json()
    assert response.status_code == 200, response.text
    (sent,) = fake.completions()
    assert sent["prompt"][: len(first) + 3] == [*first, *generation]
    assert tokenized["tokens"] == sent["prompt"] == response.json()["prompt_token_ids"]
    naive = template.render(
        messages, tools=None, add_generation_prompt=True, continue_final_message=False
    )
    assert naive[: len(first) + 3] != [*first, *generation]  # stock vLLM's prompt drifts


def test_lora_routes_are_forwarded_and_adapters_requested_by_name(
    fake: FakeVllm, template: ChatTemplate
) -> None:
    """Load, list, sample with, unload an adapter: vLLM sees each call and its name."""
    with _proxy(template, fake) as server:
        load = {"lora_name": "policy", "lora_path": "/a/v1"}
        assert requests.post(f"{server.base_url}/load_lora_adapter", json=load, timeout=10).ok
        again = requests.post(f"{server.base_url}/load_lora_adapter", json=load, timeout=10)
        models = requests.get(f"{server.base_url}/models", timeout=10).json()
        chat = _chat(server, model="policy", max_tokens=2)
        openapi = requests.get(f"{server.url}/openapi.json", timeout=10).json()
        unload = requests.post(
            f"{server.base_url}/unload_lora_adapter", json={"lora_name": "policy"}, timeout=10
        )
        unknown = _chat(server, model="policy", max_tokens=2)
    assert again.status_code == 400 and "already been loaded" in again.text
    assert [(c["id"], c["parent"]) for c in models["data"]] == [("tiny", None), ("policy", "tiny")]
    assert chat.status_code == 200 and chat.json()["model"] == "policy"
    assert fake.completions()[0]["model"] == "policy"
    assert "/v1/load_lora_adapter" in openapi["paths"]
    assert unload.ok
    assert unknown.status_code == 404
    assert unknown.json()["error"]["message"] == "The model `policy` does not exist."


def test_own_base_name_maps_to_vllms(fake: FakeVllm, template: ChatTemplate) -> None:
    """Served as ``base`` in front of vLLM's ``tiny``: /v1/models and requests translate."""
    with _proxy(template, fake, served_model_name="base") as server:
        models = requests.get(f"{server.base_url}/models", timeout=10).json()
        response = _chat(server, model="base", max_tokens=2)
        clash = requests.post(
            f"{server.base_url}/load_lora_adapter",
            json={"lora_name": "base", "lora_path": "/a"},
            timeout=10,
        )
    assert [c["id"] for c in models["data"]] == ["base"]
    assert response.json()["model"] == "base"
    assert fake.completions()[0]["model"] == "tiny"
    assert clash.status_code == 400


def test_vllm_errors_keep_their_status_and_message(fake: FakeVllm, template: ChatTemplate) -> None:
    """A context overflow stays a 400 with vLLM's wording (NeMo Gym maps it to 'length')."""
    with _proxy(template, fake) as server:
        response = _chat(server, max_tokens=5000)
    assert response.status_code == 400
    assert "maximum context length" in response.json()["error"]["message"]


def test_unreachable_vllm_is_a_503(template: ChatTemplate) -> None:
    """vLLM gone after start: the chat route answers 503 naming the URL."""
    with FakeVllm([1, EOS]) as fake:
        server = _proxy(template, fake)
    try:
        response = _chat(server, max_tokens=2)
    finally:
        server.stop()
    assert response.status_code == 503
    assert fake.base_url in response.json()["error"]["message"]


def test_misspelled_logprob_token_is_a_502(fake: FakeVllm, template: ChatTemplate) -> None:
    """A logprob entry that is not the sampled token is refused, never passed on."""
    fake.misspell = True
    with _proxy(template, fake) as server:
        response = _chat(server, max_tokens=3)
    assert response.status_code == 502


@pytest.mark.parametrize(
    ("vllm_mode", "ours", "starts"),
    [
        ("raw_logprobs", "raw_logprobs", True),
        ("processed_logprobs", "processed_logprobs", True),
        ("processed_logprobs", "raw_logprobs", False),
        ("raw_logprobs", "processed_logprobs", False),
    ],
)
def test_logprobs_mode_must_match_vllms(
    template: ChatTemplate, vllm_mode: str, ours: Any, starts: bool
) -> None:
    """The proxy measures vLLM's --logprobs-mode at start and refuses a mismatch."""
    with FakeVllm([1, EOS], logprobs_mode=vllm_mode) as fake:
        if starts:
            _proxy(template, fake, logprobs_mode=ours).stop()
        else:
            with pytest.raises(RuntimeError) as info:
                _proxy(template, fake, logprobs_mode=ours)
            assert f"returns {vllm_mode}" in str(info.value.__cause__)


def test_record_has_one_line_per_generation_keyed_by_its_tokens(
    fake: FakeVllm, template: ChatTemplate, tmp_path: Path
) -> None:
    """Seeded and unseeded requests both record the seed vLLM actually got (none for the
    unseeded one: a per-request seed crashes vLLM 0.32 on CPU under chunked prefill)."""
    recorder = SamplingRecorder(tmp_path / "record.jsonl")
    with _proxy(template, fake, recorder=recorder, logprobs_mode="raw_logprobs") as server:
        seeded = _chat(server, max_tokens=3, seed=5, temperature=0.5).json()
        unseeded = _chat(server, max_tokens=4).json()
    recorder.close()
    records = read_records(tmp_path / "record.jsonl")
    sent = fake.completions()
    for answer, request in zip((seeded, unseeded), sent, strict=True):
        key = turn_key(answer["prompt_token_ids"], answer["choices"][0]["token_ids"])
        record = records[key]
        assert record["sampling"]["seed"] == request.get("seed")  # type: ignore[index]
        assert record["sampling"]["temperature"] == request["temperature"]  # type: ignore[index]
        assert record["backend"] == "vllm" and record["logprobs_mode"] == "raw_logprobs"
    assert sent[0]["seed"] == 5 and "seed" not in sent[1]


def test_scripted_mode_needs_the_transformers_backend(template: ChatTemplate) -> None:
    backend = VllmBackend(template, "http://127.0.0.1:9/v1", name_or_path="/m")
    with pytest.raises(ValueError, match="sample"):
        ServeEngine(backend, mode="scripted")


def test_cli_vllm_backend_needs_url_and_model(capsys: pytest.CaptureFixture[str]) -> None:
    """``--backend vllm`` without ``--vllm-url``/``--model`` exits 2 with the reason."""
    from nemogym_sdk.serve.__main__ import build_parser, main

    assert main(["--backend", "vllm", "--model", "/nonexistent"]) == 2
    assert "--vllm-url" in capsys.readouterr().err
    args = build_parser().parse_args(["--backend", "vllm"])
    assert (args.mode, getattr(args, "mode_given", False)) == ("scripted", False)


def test_engine_modules_import_no_torch() -> None:
    """The proxy's modules (engine, routes, vLLM backend) do not import torch."""
    import subprocess
    import sys

    code = (
        "import sys, nemogym_sdk.serve.app, nemogym_sdk.serve.engine, "
        "nemogym_sdk.serve.proxy_routes, nemogym_sdk.serve.vllm_backend\n"
        "print('torch' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"
