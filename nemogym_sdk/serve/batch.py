"""Generations asked for at once share one forward pass per token: the CPU server's batching.

The HTTP layer answers each request on its own thread, so `CausalLMBackend.sample` is called
from many threads at once. A caller queues a `SampleJob`; the first caller to find the model
idle leads: it takes the waiting jobs of one adapter (up to ``max_batch``), decodes them
together, and hands each its `Generation` at the step it ends, while jobs that arrive meanwhile
wait for the next batch (group commit, as databases flush their logs).

A job's tokens do not depend on its companions. Each job has its own seeded generator and
sampling parameters; prompts are left-padded under an attention mask, with positions counted
from each prompt's own first token, so a batch reproduces batch-of-one logprobs up to float
rounding (about 1e-5 on the tiny model), and a batch of one is the unbatched computation.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import attrs

from nemogym_sdk.serve._deps import require_serve_deps

require_serve_deps()

import torch  # noqa: E402

from nemogym_sdk.logits import is_greedy, process_logits  # noqa: E402
from nemogym_sdk.serve.interface import Generation, LogprobsMode  # noqa: E402
from nemogym_sdk.serve.protocol import RequestSampling, TokenLogprob  # noqa: E402

if TYPE_CHECKING:
    from nemogym_sdk.serve.backend import CausalLMBackend

__all__ = ["Batcher", "SampleJob", "decode_batch"]

Finish = Callable[["SampleJob", Generation], None]


@attrs.define(eq=False, kw_only=True)
class SampleJob:
    """One generation asked for, and (once decoded) what it produced."""

    prompt_ids: tuple[int, ...]
    params: RequestSampling
    seed: int
    adapter: str | None
    top_logprobs: int
    logprobs_mode: LogprobsMode
    budget: int
    """Most tokens it may generate (checked against the context window already)."""
    aborted: threading.Event | None = None
    """Set when the client gave up on the episode: the job ends at its next token."""
    result: Generation | None = None
    error: BaseException | None = None
    done: bool = False

    @property
    def batch_key(self) -> tuple[str | None, LogprobsMode]:
        """Jobs decode together when they share the adapter and the logprobs mode."""
        return self.adapter, self.logprobs_mode


class Batcher:
    """Queues jobs from many threads and decodes them in batches, one batch at a time."""

    def __init__(self, decode: Callable[[list[SampleJob], Finish], None], max_batch: int) -> None:
        """``decode(jobs, finish)`` runs one batch and calls ``finish`` as each job ends."""
        if max_batch < 1:
            raise ValueError(f"max_batch must be at least 1, got {max_batch}")
        self.max_batch = max_batch
        self._decode = decode
        self._turn = threading.Condition()
        self._waiting: list[SampleJob] = []
        self._leading = False

    @property
    def queued(self) -> int:
        """Jobs waiting for a batch (not counting the batch being decoded)."""
        with self._turn:
            return len(self._waiting)

    def run(self, job: SampleJob) -> Generation:
        """Queue ``job``, take part in decoding until it is done, and return its generation."""
        with self._turn:
            self._waiting.append(job)
            while not job.done:
                if self._leading:
                    self._turn.wait()
                else:
                    self._lead()
        if job.error is not None:
            raise job.error
        assert job.result is not None  # done without an error means finished
        return job.result

    def _lead(self) -> None:
        """Decode the next batch (called holding ``_turn``; released while decoding)."""
        key = self._waiting[0].batch_key
        batch = [job for job in self._waiting if job.batch_key == key][: self.max_batch]
        self._waiting = [job for job in self._waiting if job not in batch]
        self._leading = True
        self._turn.release()
        failure: BaseException | None = None
        try:
            self._decode(batch, self._finish)
        except Exception as error:  # noqa: BLE001 - every caller of the batch raises it
            failure = error
        finally:
            self._turn.acquire()
            self._leading = False
            for job in batch:
                if not job.done:
                    job.error = failure or RuntimeError("The batch ended before this generation.")
                    job.done = True
            self._turn.notify_all()

    def _finish(self, job: SampleJob, generation: Generation) -> None:
        with self._turn:
            job.result, job.done = generation, True
            self._turn.notify_all()


def decode_batch(
    backend: CausalLMBackend, model: Any, jobs: Sequence[SampleJob], finish: Finish
) -> None:
    """Generate for every job at once (KV-cached), calling ``finish`` as each one ends."""
    device = backend.device
    rows = list(jobs)
    width = max(len(job.prompt_ids) for job in rows)
    ids_BL = torch.full((len(rows), width), backend.eos_token_id, dtype=torch.long)
    mask_BL = torch.zeros((len(rows), width), dtype=torch.long)
    for i, job in enumerate(rows):
        ids_BL[i, width - len(job.prompt_ids) :] = torch.tensor(job.prompt_ids)
        mask_BL[i, width - len(job.prompt_ids) :] = 1
    ids_BL, mask_BL = ids_BL.to(device), mask_BL.to(device)
    positions_BL = (mask_BL.cumsum(-1) - 1).clamp(min=0)
    out = backend.forward(model, ids_BL, keep=1, mask=mask_BL, positions=positions_BL)
    next_B1 = positions_BL[:, -1:] + 1
    generators = [torch.Generator(device=device).manual_seed(job.seed) for job in rows]
    tokens: list[list[TokenLogprob]] = [[] for _ in rows]
    while True:
        drawn = _draw(backend, out.logits[:, -1].float(), rows, generators)
        backend.generated_tokens += len(rows)
        keep: list[int] = []
        for i, (job, entry) in enumerate(zip(rows, drawn, strict=True)):
            tokens[i].append(entry)
            generation = _ended(backend, job, tokens[i])
            if generation is None:
                keep.append(i)
            else:
                finish(job, generation)
        if not keep:
            return
        chosen_B1 = torch.tensor([[drawn[i].token_id] for i in keep], device=device)
        cache = backend.cache_of(out)
        if len(keep) < len(rows):
            index = torch.tensor(keep, device=device)
            cache.batch_select_indices(index)
            mask_BL, next_B1 = mask_BL[index], next_B1[index]
            rows = [rows[i] for i in keep]
            tokens = [tokens[i] for i in keep]
            generators = [generators[i] for i in keep]
        mask_BL = torch.cat([mask_BL, torch.ones_like(next_B1)], dim=-1)
        out = backend.forward(
            model, chosen_B1, keep=1, cache=cache, mask=mask_BL, positions=next_B1
        )
        next_B1 = next_B1 + 1


def _draw(
    backend: CausalLMBackend,
    logits_BV: torch.Tensor,
    jobs: Sequence[SampleJob],
    generators: Sequence[torch.Generator],
) -> list[TokenLogprob]:
    """Pick each row's next token by its own parameters and seed; report its logprob."""
    chosen = [0] * len(jobs)
    reported_BV = torch.log_softmax(logits_BV, dim=-1)
    for params, index in _by_sampling(jobs).items():
        processed_NV = process_logits(
            logits_BV[index],
            temperature=params.temperature,
            top_k=params.top_k,
            top_p=params.top_p,
        )
        if is_greedy(params.temperature):
            picks = processed_NV.argmax(dim=-1).tolist()
        else:
            probs_NV = torch.softmax(processed_NV, dim=-1)
            picks = [
                int(torch.multinomial(probs_NV[n], 1, generator=generators[row]))
                for n, row in enumerate(index)
            ]
        for row, pick in zip(index, picks, strict=True):
            chosen[row] = int(pick)
        if jobs[0].logprobs_mode == "processed_logprobs":  # one mode per batch
            reported_BV[index] = torch.log_softmax(processed_NV, dim=-1)
    picked = reported_BV.gather(1, torch.tensor(chosen, device=logits_BV.device)[:, None])
    return [
        backend.entry(token, reported_BV[row], job.top_logprobs, logprob=logprob)
        for row, (job, token, logprob) in enumerate(
            zip(jobs, chosen, picked[:, 0].tolist(), strict=True)
        )
    ]


def _by_sampling(jobs: Sequence[SampleJob]) -> dict[RequestSampling, list[int]]:
    """Rows grouped by the part of their parameters that shapes the distribution."""
    groups: dict[RequestSampling, list[int]] = {}
    for row, job in enumerate(jobs):
        shape = RequestSampling(
            temperature=job.params.temperature, top_k=job.params.top_k, top_p=job.params.top_p
        )
        groups.setdefault(shape, []).append(row)
    return groups


def _ended(
    backend: CausalLMBackend, job: SampleJob, tokens: list[TokenLogprob]
) -> Generation | None:
    """The job's generation if its last token ends it (EOS, a stop, the budget) or it was
    aborted, else None."""
    params, token = job.params, tokens[-1].token_id
    if job.aborted is not None and job.aborted.is_set():
        return Generation(tokens=tuple(tokens), finish_reason="abort")
    if token in backend.eos_token_ids and not params.ignore_eos:
        return Generation(tokens=tuple(tokens), finish_reason="stop")
    if token in params.stop_token_ids:
        return Generation(tokens=tuple(tokens), finish_reason="stop", stop_reason=token)
    if params.stop:
        text = backend.decode([t.token_id for t in tokens])
        hits = [(text.find(s), s) for s in params.stop if s in text]
        if hits:
            at, which = min(hits)
            return Generation(
                tokens=tuple(tokens), finish_reason="stop", stop_reason=which, text_end=at
            )
    if len(tokens) >= job.budget:
        return Generation(tokens=tuple(tokens), finish_reason="length")
    return None
