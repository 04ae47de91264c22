"""Episodes the client gave up on stop costing the sampler: a generation in flight stops and
later turns are refused, on the CPU server and through the proxy in front of vLLM."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import requests

from nemogym_sdk.serve.episodes import EpisodeAbandonedError, Episodes
from tests.serve.conftest import MODEL_NAME, make_server


def test_abandoning_stops_what_runs_and_refuses_what_comes() -> None:
    episodes = Episodes(remember=2)
    stopped: list[str] = []
    with (
        episodes.running("e1", lambda: stopped.append("e1")) as aborted,
        episodes.running("e2") as other,
    ):
        assert episodes.abandon("e1") == 1
        assert aborted.is_set() and not other.is_set() and stopped == ["e1"]
    with pytest.raises(EpisodeAbandonedError, match="'e1' was abandoned"):
        episodes.check("e1")
    with pytest.raises(EpisodeAbandonedError), episodes.running("e1"):
        pass  # never entered
    episodes.check("e2")
    episodes.check(None)  # a turn without an episode id is never refused
    assert (episodes.aborted_generations, episodes.refused_turns) == (1, 2)
    assert episodes.abandon("gone-before-it-came") == 0
    episodes.abandon("e3")  # remembers the newest two: e1 is forgotten
    episodes.check("e1")


def _chat(url: str, episode: str | None, max_tokens: int) -> requests.Response:
    body: dict[str, Any] = {
        "model": MODEL_NAME,
        "messages": [{"role": "user", "content": "go on"}],
        "max_tokens": max_tokens,
        "ignore_eos": True,
    }
    if episode is not None:
        body["nemogym_episode_id"] = episode
    return requests.post(f"{url}/chat/completions", json=body, timeout=120)


def _tokens(server: Any) -> int:
    text = requests.get(f"{server.url}/metrics", timeout=10).text
    line = next(x for x in text.splitlines() if x.startswith("nemogym_serve_generation_tokens"))
    return int(line.split()[1])


@pytest.fixture
def sampler() -> Iterator[Any]:
    pytest.importorskip("transformers")
    server = make_server("sample")
    yield server
    server.stop()


def test_an_abandoned_episode_stops_generating_on_the_cpu_server(sampler: Any) -> None:
    """A 4,000-token turn is stopped within a token of the abort (HTTP 409 to NeMo Gym's
    model server), the server's token count stops with it, the episode's next turn is
    refused before any token, and another episode is untouched."""
    answers: dict[str, requests.Response] = {}
    playing = threading.Thread(
        target=lambda: answers.update(long=_chat(sampler.base_url, "e1", 4000))
    )
    playing.start()
    deadline = time.monotonic() + 60
    while _tokens(sampler) < 20 and time.monotonic() < deadline:
        time.sleep(0.05)
    aborted = requests.post(f"{sampler.url}/abort_episode", params={"episode_id": "e1"}, timeout=10)
    assert aborted.json() == {"status": "ok", "episode_id": "e1", "stopped": 1}
    playing.join(timeout=30)
    assert answers["long"].status_code == 409, answers["long"].text
    assert "EpisodeAbandonedError" in answers["long"].text
    at_abort = _tokens(sampler)
    time.sleep(0.5)
    assert _tokens(sampler) == at_abort < 4000  # nothing generated after the abort
    refused = _chat(sampler.base_url, "e1", 50)
    assert refused.status_code == 409 and _tokens(sampler) == at_abort
    other = _chat(sampler.base_url, "e2", 5)
    assert other.status_code == 200 and _tokens(sampler) == at_abort + 5
    metrics = requests.get(f"{sampler.url}/metrics", timeout=10).text
    assert "nemogym_serve_aborted_generations_total 1" in metrics
    assert "nemogym_serve_refused_turns_total 1" in metrics
    missing = requests.post(f"{sampler.url}/abort_episode", timeout=10)
    assert missing.status_code == 400 and "episode_id" in missing.text


def test_an_abandoned_episode_closes_its_request_to_vllm() -> None:
    """Through the proxy, the abort closes the request in flight to vLLM (which aborts a
    request whose client went away): answered 409 at once, not when vLLM would finish."""
    pytest.importorskip("transformers")
    from nemogym_sdk.serve import ServeEngine, ServerThread, VllmBackend
    from nemogym_sdk.serve.template import ChatTemplate
    from nemogym_sdk.serve.tiny import build_tiny_tokenizer
    from tests.serve.fake_vllm import FakeVllm

    template = ChatTemplate(build_tiny_tokenizer(), eos_token_ids={2}, name="tiny")
    with FakeVllm([5, 6, 2]) as fake:
        backend = VllmBackend(template, fake.base_url, name_or_path="/m", connect_wait=2.0)
        proxy = ServerThread(ServeEngine(backend, mode="sample")).start()
        try:
            fake.delay = 3.0
            answers: dict[str, requests.Response] = {}
            playing = threading.Thread(
                target=lambda: answers.update(long=_chat(proxy.base_url, "e1", 3))
            )
            started = time.monotonic()
            playing.start()
            while not fake.completions() and time.monotonic() - started < 30:
                time.sleep(0.02)
            stopped = requests.post(
                f"{proxy.url}/abort_episode", params={"episode_id": "e1"}, timeout=10
            ).json()["stopped"]
            playing.join(timeout=30)
            assert stopped == 1 and answers["long"].status_code == 409
            assert time.monotonic() - started < 2.5  # not the 3 s vLLM would have taken
            time.sleep(3.2)
            assert fake.abandoned == 1  # vLLM found its client gone
            fake.delay = 0.0
            assert _chat(proxy.base_url, "e1", 3).status_code == 409
            assert len(fake.completions()) == 1  # refused before reaching vLLM
            assert _chat(proxy.base_url, "e2", 3).status_code == 200
        finally:
            proxy.stop()
