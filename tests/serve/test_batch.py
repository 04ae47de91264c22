"""Batched decoding: generations asked for at once share forward passes, and each one is what
it would have been alone (tokens exact, logprobs to float rounding)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

pytest.importorskip("transformers")

from nemogym_sdk.serve.backend import CausalLMBackend
from nemogym_sdk.serve.batch import Batcher, SampleJob
from nemogym_sdk.serve.errors import NotFoundError
from nemogym_sdk.serve.interface import Generation
from nemogym_sdk.serve.protocol import RequestSampling

QUESTIONS = ["Hi.", "Tell me about the weather in Paris today.", "2+2?", "Name three rivers."]
PARAMS = [
    RequestSampling(max_tokens=12, temperature=0.0, ignore_eos=True),
    RequestSampling(max_tokens=20, temperature=1.0),
    RequestSampling(max_tokens=9, temperature=0.7, top_k=20, ignore_eos=True),
    RequestSampling(max_tokens=16, temperature=1.2, top_p=0.8, stop=("e",)),
    RequestSampling(max_tokens=14, temperature=1.0, stop_token_ids=(101,)),
]


def _requests(backend: CausalLMBackend, n: int) -> list[dict[str, Any]]:
    """``n`` different generations: prompts of several lengths, mixed parameters and seeds."""
    return [
        {
            "prompt_ids": backend.prompt_ids(
                [{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)] * (1 + i % 3)}]
            ),
            "params": PARAMS[i % len(PARAMS)],
            "seed": 100 + i,
            "top_logprobs": 2 if i % 4 == 0 else 0,
        }
        for i in range(n)
    ]


def _at_once(calls: list[Callable[[], Generation]]) -> list[Generation | BaseException]:
    """Run every call on its own thread, released together; results in call order."""
    results: list[Generation | BaseException] = [RuntimeError("not run")] * len(calls)
    start = threading.Barrier(len(calls))

    def run(index: int) -> None:
        start.wait()
        try:
            results[index] = calls[index]()
        except Exception as error:  # noqa: BLE001 - handed to the test to inspect
            results[index] = error

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    return results


def _batch_sizes(backend: CausalLMBackend) -> list[int]:
    """Record the batch size of every forward pass ``backend`` makes from now on."""
    sizes: list[int] = []
    forward = backend.forward

    def counting(model: Any, input_ids_BT: Any, *args: Any, **kwargs: Any) -> Any:
        sizes.append(int(input_ids_BT.shape[0]))
        return forward(model, input_ids_BT, *args, **kwargs)

    backend.forward = counting  # type: ignore[method-assign]
    return sizes


@pytest.mark.parametrize("logprobs_mode", ["raw_logprobs", "processed_logprobs"])
def test_concurrent_generations_share_forward_passes_and_match_their_solo_runs(
    logprobs_mode: Any,
) -> None:
    """24 threads at once: fewer forward passes than solo, and every generation identical in
    tokens, finish and stop reasons, alternatives, with logprobs within 1e-4."""
    backend = CausalLMBackend.tiny(0)
    requests = _requests(backend, 24)
    solo = [backend.sample(**r, logprobs_mode=logprobs_mode) for r in requests]
    sizes = _batch_sizes(backend)
    together = _at_once(
        [lambda r=r: backend.sample(**r, logprobs_mode=logprobs_mode) for r in requests]
    )
    assert max(sizes) > 4, sizes  # generations really were decoded together
    assert len(sizes) < sum(len(g.tokens) for g in solo) / 2
    for alone, batched in zip(solo, together, strict=True):
        assert isinstance(batched, Generation), batched
        assert batched.token_ids == alone.token_ids
        assert (batched.finish_reason, batched.stop_reason, batched.text_end) == (
            alone.finish_reason,
            alone.stop_reason,
            alone.text_end,
        )
        assert [t.logprob for t in batched.tokens] == pytest.approx(
            [t.logprob for t in alone.tokens], abs=1e-4
        )
        assert [[i for i, _, _ in t.top] for t in batched.tokens] == [
            [i for i, _, _ in t.top] for t in alone.tokens
        ]
    assert {g.finish_reason for g in solo} == {"stop", "length"}  # both ways of ending ran


def test_a_batch_holds_one_adapter_and_a_missing_one_fails_only_its_callers() -> None:
    """Requests for an unknown adapter raise 404 to their callers; the base model's requests
    beside them are answered as if alone."""
    backend = CausalLMBackend.tiny(0)
    requests = _requests(backend, 6)
    solo = [backend.sample(**r) for r in requests]
    calls: list[Callable[[], Generation]] = []
    for r in requests:
        calls.append(lambda r=r: backend.sample(**r))
        calls.append(lambda r=r: backend.sample(**r, adapter="gone"))
    results = _at_once(calls)
    assert [g.token_ids for g in results[::2] if isinstance(g, Generation)] == [
        g.token_ids for g in solo
    ]
    for failed in results[1::2]:
        assert isinstance(failed, NotFoundError) and "`gone` does not exist" in str(failed)


def test_the_batcher_caps_batches_and_gives_every_caller_the_batchs_error() -> None:
    """At most ``max_batch`` jobs per batch; a decode that raises reaches every caller of that
    batch and no other, and the batches after it run."""
    seen: list[list[int]] = []
    started, gate = threading.Event(), threading.Event()

    def decode(jobs: list[SampleJob], finish: Callable[[SampleJob, Generation], None]) -> None:
        started.set()
        gate.wait(timeout=30)  # hold the first batch until every other job has queued
        seen.append([job.seed for job in jobs])
        if 13 in seen[-1]:
            raise ValueError("broken batch")
        for job in jobs:
            finish(job, Generation(tokens=(), finish_reason="length"))

    batcher = Batcher(decode, max_batch=4)
    results: dict[int, Generation | BaseException] = {}

    def run(seed: int) -> None:
        job = SampleJob(
            prompt_ids=(1,),
            params=RequestSampling(),
            seed=seed,
            adapter=None,
            top_logprobs=0,
            logprobs_mode="raw_logprobs",
            budget=1,
        )
        try:
            results[seed] = batcher.run(job)
        except ValueError as error:
            results[seed] = error

    threads = [threading.Thread(target=run, args=(seed,)) for seed in range(10, 20)]
    threads[0].start()
    assert started.wait(timeout=30)
    for thread in threads[1:]:
        thread.start()
    while batcher.queued < 9:
        time.sleep(0.001)
    gate.set()
    for thread in threads:
        thread.join(timeout=30)
    assert [len(batch) for batch in seen] == [1, 4, 4, 1]
    assert sorted(seed for batch in seen for seed in batch) == list(range(10, 20))
    broken = next(batch for batch in seen if 13 in batch)
    for seed, result in results.items():
        assert isinstance(result, ValueError if seed in broken else Generation), (seed, result)
    with pytest.raises(ValueError, match="at least 1"):
        Batcher(decode, max_batch=0)
