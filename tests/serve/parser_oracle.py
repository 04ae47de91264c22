"""vLLM's output parsers as the oracle of ours: ``vllm_parses`` runs them (in ``.venv-vllm``,
through ``vllm_parsers_oracle.py``) on a list of cases with a family's tokenizer."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from nemogym_sdk.samplers.vllm import VllmVenvNotFoundError, find_vllm_venv

ORACLE = Path(__file__).with_name("vllm_parsers_oracle.py")


def vllm_parses(tokenizer_dir: Path, cases: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """What vLLM 0.32's parsers make of each case (``{"text", "reasoning_parser",
    "tool_parser", "tools", "tool_choice", "chat_template_kwargs"}``): one
    ``{"reasoning", "content", "tool_calls": [[name, arguments], ...]}`` per case. Skips the
    test where ``.venv-vllm`` is absent."""
    try:
        python = find_vllm_venv().python
    except VllmVenvNotFoundError as error:  # no vLLM on this machine: nothing to compare with
        pytest.skip(f"vLLM's parsers are not installed: {error}")
    done = subprocess.run(
        [str(python), str(ORACLE), str(tokenizer_dir)],
        input=json.dumps(list(cases)),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    answers: list[dict[str, Any]] = json.loads(done.stdout)
    assert len(answers) == len(cases)
    return answers
