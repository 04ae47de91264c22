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


def _frozen(array: npt.NDArray[Any]) -> npt.NDArray[Any]:
    array.setflags(write=False)
    return array


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


class CompletionBuilder:
    """Collects model and environment segments, then writes them into arrays once."""

    __slots__ = ("_length", "_segments")

    def __init__(self) -> None:
        # (ids, logprobs) per segment; logprobs None marks an environment segment
        self._segments: list[tuple[npt.NDArray[np.int64], npt.NDArray[np.float64] | None]] = []
        self._length = 0

    def __len__(self) -> int:
        return self._length

    def add_model(self, ids: npt.ArrayLike, logprobs: npt.ArrayLike) -> None:
        """Append tokens the policy generated, with one sampling logprob per token.

        Raises ``ValueError`` when the counts differ: a missing logprob is never
        padded, because a made-up 0.0 means probability 1 and corrupts importance ratios.
        """
        ids_T = np.asarray(ids, dtype=np.int64)
        logprobs_T = np.asarray(logprobs, dtype=np.float64)
        if ids_T.shape != logprobs_T.shape or ids_T.ndim != 1:
            raise ValueError(
                f"{logprobs_T.size} logprobs for {ids_T.size} generated tokens; "
                "each generated token needs exactly one logprob"
            )
        self._append(ids_T, logprobs_T)

    def add_env(self, ids: npt.ArrayLike | Sequence[int]) -> None:
        """Append environment tokens (mask 0, logprob 0.0)."""
        ids_T = np.asarray(ids, dtype=np.int64)
        if ids_T.ndim != 1:
            raise ValueError(f"expected a 1-D sequence of ids, got shape {ids_T.shape}")
        self._append(ids_T, None)

    def _append(
        self, ids_T: npt.NDArray[np.int64], logprobs_T: npt.NDArray[np.float64] | None
    ) -> None:
        if ids_T.shape[0]:
            self._segments.append((ids_T, logprobs_T))
            self._length += int(ids_T.shape[0])

    def build(self) -> Completion:
        """The completion assembled so far (the builder can keep growing afterwards)."""
        ids_T = np.empty(self._length, dtype=np.int64)
        mask_T = np.zeros(self._length, dtype=np.int8)
        logprobs_T = np.zeros(self._length, dtype=np.float64)
        start = 0
        for segment_ids, segment_logprobs in self._segments:
            stop = start + segment_ids.shape[0]
            ids_T[start:stop] = segment_ids
            if segment_logprobs is not None:
                mask_T[start:stop] = 1
                logprobs_T[start:stop] = segment_logprobs
            start = stop
        return Completion(
            ids=_frozen(ids_T), env_mask=_frozen(mask_T), logprobs=_frozen(logprobs_T)
        )
