"""vLLM's ``deepseek_r1`` reasoning parser (``vllm/reasoning/basic_parsers.py``,
``BaseThinkingReasoningParser.extract_reasoning``, vLLM 0.32), non-streaming.

The prompt may have opened ``<think>`` already, so everything up to the first ``</think>`` is
reasoning; text before a ``<think>`` the model wrote is dropped; without ``</think>`` the
whole output is reasoning. Nothing is stripped.
"""

from __future__ import annotations

__all__ = ["deepseek_r1_reasoning"]

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"


def deepseek_r1_reasoning(text: str) -> tuple[str | None, str | None]:
    """``(reasoning, content)``; ``content`` is ``None`` when nothing follows ``</think>``."""
    _, opened, after = text.partition(THINK_OPEN)
    rest = after if opened else text
    if THINK_CLOSE not in rest:
        return rest, None
    reasoning, _, content = rest.partition(THINK_CLOSE)
    return reasoning, content or None
