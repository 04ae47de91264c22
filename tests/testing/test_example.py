"""``examples/testing_my_parser.py`` (the docs' complete example) runs and passes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "testing_my_parser.py"


def test_the_testing_example_passes() -> None:
    """Run as a user would (``pytest examples/testing_my_parser.py``), with the plugin
    enabled by the example's own ``pytest_plugins``."""
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(EXAMPLE)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "3 passed" in result.stdout


def test_the_docs_show_the_example_as_it_runs() -> None:
    """docs/testing.md's complete example is the file CI runs, verbatim."""
    page = (ROOT / "docs" / "testing.md").read_text()
    assert f"```python\n{EXAMPLE.read_text()}```" in page
