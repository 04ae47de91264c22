"""Skip, or fail in CI, when a venv that real-component tests need is absent.

``make test`` on a machine without Python 3.13 (or without the vLLM or axolotl venv)
skips the tests that need it, saying why. CI sets ``NEMOGYM_REQUIRE_GYM=1`` (``.ci/run``):
there an absent venv fails those tests instead, so a broken venv build can never turn
every real-NeMo-Gym test into a silent skip.
"""

from __future__ import annotations

import os
from typing import NoReturn

import pytest

REQUIRE_ENV_VAR = "NEMOGYM_REQUIRE_GYM"


def required() -> bool:
    """Whether absent venvs are failures here (``NEMOGYM_REQUIRE_GYM=1``)."""
    return os.environ.get(REQUIRE_ENV_VAR, "") == "1"


def absent(reason: str) -> NoReturn:
    """Skip the test with ``reason``; under ``NEMOGYM_REQUIRE_GYM=1`` fail it instead."""
    if required():
        pytest.fail(f"{reason} ({REQUIRE_ENV_VAR}=1: this run requires it)", pytrace=False)
    pytest.skip(reason)
