"""The env-mask builder: the one place that assembles a completion from token segments.

A completion is a sequence of *model* segments (tokens the policy sampled: mask 1,
with their sampling logprobs) and *environment* segments (tool outputs, user turns
and chat-template glue between model turns: mask 0, logprob 0.0). The turn parser
builds completions with it, and trainer adapters that run their own tool loops use
the same builder, so every completion in the project is assembled the same way.

Example, with tiny integer tokens::

    builder = CompletionBuilder()
    builder.add_model([30, 31], [-0.1, -0.2])   # the policy's first turn
    builder.add_env([100, 101, 102])            # a tool result
    builder.add_model([40, 41], [-0.3, -0.4])   # the policy's second turn
    c = builder.build()
    c.ids      -> [30, 31, 100, 101, 102, 40, 41]
    c.env_mask -> [ 1,  1,   0,   0,   0,  1,  1]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs
import numpy as np
import numpy.typing as npt

__all__ = ["Completion", "CompletionBuilder"]


@attrs.frozen(kw_only=True, eq=False)
class Completion:
    """Aligned completion arrays, all of shape ``[T]`` and read-only."""

    ids: npt.NDArray[np.int64]
    """Token ids."""
    env_mask: npt.NDArray[np.int8]
    """1 for policy tokens, 0 for environment tokens."""
    logprobs: npt.NDArray[np.float64]
    """Sampling logprobs of policy tokens; 0.0 on environment tokens."""
    truncated: bool = False
    """Whether ``truncate`` cut tokens off the end."""

    def __len__(self) -> int:
        return int(self.ids.shape[0])

    @property
    def num_model_tokens(self) -> int:
        """Number of policy tokens (the mask's sum)."""
        return int(self.env_mask.sum())

    def truncate(self, max_length: int | None) -> Completion:
        """Cut ids, mask and logprobs together to ``max_length`` tokens, flagging the cut."""
        if max_length is None or len(self) <= max_length:
            return self
        if max_length < 0:
            raise ValueError(f"max_length must be >= 0, got {max_length}")
        return Completion(
            ids=self.ids[:max_length],
            env_mask=self.env_mask[:max_length],
            logprobs=self.logprobs[:max_length],
            truncated=True,
        )


Buffer = bytes | bytearray | memoryview
"""Raw native-endian buffers of bytes (``len`` counts bytes): int64 token ids, float64
logprobs."""

_ID_BYTES = 8
_ONE = b"\x01"
_ZERO = b"\x00"


class CompletionBuilder:
    """Collects model and environment segments, then joins them once.

    Segments are kept as raw native buffers and joined with ``bytes.join``, so
    building costs the same few C calls whatever the number of segments.
    """

    __slots__ = ("_ids", "_length", "_logprobs", "_mask")

    def __init__(self) -> None:
        self._ids: list[Buffer] = []
        self._mask: list[bytes] = []
        self._logprobs: list[Buffer] = []
        self._length = 0

    def __len__(self) -> int:
        return self._length

    def add_model(self, ids: npt.ArrayLike, logprobs: npt.ArrayLike) -> None:
        """Append tokens the policy generated, with one sampling logprob per token.

        Raises ``ValueError`` when the counts differ: a missing logprob is never
        padded, because a made-up 0.0 means probability 1 and corrupts importance ratios.
        """
        ids_T = _as_1d(ids, np.int64)
        logprobs_T = _as_1d(logprobs, np.float64)
        self.add_model_raw(ids_T.data.cast("B"), logprobs_T.data.cast("B"))

    def add_env(self, ids: npt.ArrayLike | Sequence[int]) -> None:
        """Append environment tokens (mask 0, logprob 0.0)."""
        self.add_env_raw(_as_1d(ids, np.int64).data.cast("B"))

    def add_model_raw(self, ids: Buffer, logprobs: Buffer) -> None:
        """``add_model`` for raw byte buffers: native int64 ids and float64 logprobs."""
        n_bytes = len(ids)
        if n_bytes != len(logprobs) or n_bytes % _ID_BYTES:
            raise ValueError(
                f"{len(logprobs) // _ID_BYTES} logprobs for {n_bytes // _ID_BYTES} generated "
                "tokens; each generated token needs exactly one logprob"
            )
        if n_bytes:
            n = n_bytes // _ID_BYTES
            self._ids.append(ids)
            self._mask.append(_ONE * n)
            self._logprobs.append(logprobs)
            self._length += n

    def add_env_raw(self, ids: Buffer) -> None:
        """``add_env`` for a raw byte buffer of native int64 ids."""
        n_bytes = len(ids)
        if n_bytes % _ID_BYTES:
            raise ValueError(f"{n_bytes} bytes is not a whole number of int64 token ids")
        if n_bytes:
            self._ids.append(ids)
            self._mask.append(_ZERO * (n_bytes // _ID_BYTES))
            self._logprobs.append(bytes(n_bytes))  # 0.0 is all-zero bytes
            self._length += n_bytes // _ID_BYTES

    def build(self) -> Completion:
        """The completion assembled so far (the builder can keep growing afterwards)."""
        return Completion(
            ids=np.frombuffer(b"".join(self._ids), dtype=np.int64),
            env_mask=np.frombuffer(b"".join(self._mask), dtype=np.int8),
            logprobs=np.frombuffer(b"".join(self._logprobs), dtype=np.float64),
        )


def _as_1d(values: object, dtype: type[np.generic]) -> npt.NDArray[Any]:
    array = np.ascontiguousarray(values, dtype=dtype)
    if array.ndim != 1:
        raise ValueError(f"expected a 1-D sequence, got shape {array.shape}")
    return array
