"""The kit is opt-in: ``import nemogym_sdk`` loads neither it nor Hypothesis nor aiohttp."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any


def _modules_after(code: str) -> Any:
    result = subprocess.run(
        [sys.executable, "-c", f"import sys, json; {code}; print(json.dumps(sorted(sys.modules)))"],
        capture_output=True,
        text=True,
        check=True,
    )
    return set(json.loads(result.stdout))


def test_import_nemogym_sdk_loads_neither_hypothesis_nor_aiohttp() -> None:
    """The kit is opt-in: the SDK's import does not load it or its dependencies."""
    loaded = _modules_after("import nemogym_sdk")
    assert not {m for m in loaded if m.split(".")[0] in {"hypothesis", "aiohttp"}}
    assert "nemogym_sdk.testing" not in loaded
    kit = _modules_after("import nemogym_sdk.testing")
    assert {"hypothesis", "nemogym_sdk.testing"} <= kit
    assert "pytest" not in kit  # the plugin module is separate
