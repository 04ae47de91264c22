"""One JSON line per generation: what each rollout turn was sampled with (``--record PATH``).

A trainer compares its own logprobs with the sampler's, so it must know the distribution each
turn came from: temperature, top-p, top-k, the seed actually used (drawn by the transformers
backend when the request sent none; the vLLM backend forwards only a seed the request sent, so
there it may be null: vLLM's engine-wide generator), the logprob mode, and the model or
adapter that generated. Lines are keyed by `turn_key`, which a trainer recomputes from a NeMo
Gym output item's ``prompt_token_ids`` and ``generation_token_ids`` to join a rollout turn to
its record::

    {"time": 1796219312.4, "id": "chatcmpl-…", "key": "9f2c…", "model": "policy",
     "sampled_model": "policy@v3", "version": 3, "backend": "vllm", "mode": "sample",
     "logprobs_mode": "processed_logprobs", "prompt_tokens": 41, "completion_tokens": 12,
     "finish_reason": "length", "sampling": {"temperature": 1.0, "top_p": 1.0, "top_k": 0,
     "max_tokens": 12, "seed": 6311, "stop": [], "stop_token_ids": [], "ignore_eos": false}}
"""

from __future__ import annotations

import hashlib
import threading
import time
from array import array
from collections.abc import Sequence
from pathlib import Path
from typing import IO

import attrs
import orjson

from nemogym_sdk.serve.protocol import RequestSampling

__all__ = ["SamplingRecorder", "read_records", "turn_key"]


def turn_key(prompt_ids: Sequence[int], generation_ids: Sequence[int]) -> str:
    """A stable hex key of one model turn: SHA-256 of its prompt and generated token ids."""
    digest = hashlib.sha256(array("q", prompt_ids).tobytes())
    digest.update(b"|")
    digest.update(array("q", generation_ids).tobytes())
    return digest.hexdigest()[:32]


class SamplingRecorder:
    """Appends one JSON line per generation to a file (thread-safe; flushed per line)."""

    def __init__(self, path: str | Path) -> None:
        """Open ``path`` for appending (parent directories are created)."""
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._stream: IO[bytes] = open(self.path, "ab")  # noqa: SIM115 - closed in close()
        self._lock = threading.Lock()

    def record(
        self,
        *,
        completion_id: str,
        model: str,
        sampled_model: str,
        backend: str,
        mode: str,
        logprobs_mode: str,
        params: RequestSampling,
        seed: int | None,
        prompt_ids: Sequence[int],
        generation_ids: Sequence[int],
        finish_reason: str,
        version: int | None = None,
    ) -> None:
        """Write one line (``seed`` is the one used, which may differ from ``params.seed``;
        ``version`` the adapter version that generated, when the name is versioned)."""
        sampling = attrs.asdict(params)
        sampling["seed"] = seed
        line = {
            "time": round(time.time(), 3),
            "id": completion_id,
            "key": turn_key(prompt_ids, generation_ids),
            "model": model,
            "sampled_model": sampled_model,
            "version": version,
            "backend": backend,
            "mode": mode,
            "logprobs_mode": logprobs_mode,
            "prompt_tokens": len(prompt_ids),
            "completion_tokens": len(generation_ids),
            "finish_reason": finish_reason,
            "sampling": sampling,
        }
        data = orjson.dumps(line) + b"\n"
        with self._lock:
            self._stream.write(data)
            self._stream.flush()

    def close(self) -> None:
        """Close the file."""
        with self._lock:
            self._stream.close()


def read_records(path: str | Path) -> dict[str, dict[str, object]]:
    """Read a record file into ``{turn_key: record}`` (a later line with the same key wins)."""
    records: dict[str, dict[str, object]] = {}
    with open(path, "rb") as stream:
        for line in stream:
            if line.strip():
                record = orjson.loads(line)
                records[str(record["key"])] = record
    return records
