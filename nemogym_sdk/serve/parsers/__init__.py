"""Reasoning and tool calls in generated text, read as vLLM 0.32 reads them.

`OutputParsers` takes vLLM's parser names (``--reasoning-parser``: ``qwen3``,
``deepseek_r1``; ``--tool-call-parser``: ``hermes``, ``qwen3_coder``/``qwen3_xml``,
``llama3_json``) and turns a generated turn into the message vLLM's chat server answers
with. Plain Python, no torch; checked against vLLM's own parsers in the test suite.
"""

from __future__ import annotations

from nemogym_sdk.serve.parsers.output import (
    REASONING_PARSERS,
    TOOL_CALL_PARSERS,
    OutputParsers,
    ParsedTurn,
)

__all__ = ["REASONING_PARSERS", "TOOL_CALL_PARSERS", "OutputParsers", "ParsedTurn"]
