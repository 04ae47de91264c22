"""``examples/testing_my_parser.py`` (the docs' complete example) runs and passes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

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


TWO_LINES = """from nemogym_sdk.testing import Parser, check_all

check_all(Parser(parse=lambda response: parse(response, 2), name="my parser"))
"""


def test_the_docs_two_line_wiring_runs_and_catches_a_bug() -> None:
    """The docs' two lines, run as written on a dict-returning ``parse(response, eos)``:
    they pass the correct parser and catch a negated reward (under a small profile)."""
    from hypothesis import settings

    from tests.testing import planted

    # the block defines a stand-in ``parse`` first (tests/docs runs it as a script)
    assert f"\n\n{TWO_LINES}```" in (ROOT / "docs" / "testing.md").read_text()
    previous = settings.get_current_profile_name()
    settings.register_profile("two-lines", settings(settings.default, max_examples=10))
    settings.load_profile("two-lines")
    try:
        exec(TWO_LINES, {"parse": planted.parse})
        buggy = {"parse": lambda response, eos: planted.parse(response, eos, ["reward_negated"])}
        with pytest.raises(AssertionError, match=r"\[reward\] the sample's reward is "):
            exec(TWO_LINES, buggy)
    finally:
        settings.load_profile(previous)
