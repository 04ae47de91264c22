"""Output shown on a page is what its script prints.

A ```` ```text ```` block right after a line ``<!-- output: examples/docs/xyz.py -->`` shows
that script's output (the env-mask drawing of ``docs/concepts/rollouts.md``, drawn from a
real parse and collate); the script is run and its stdout must equal the block, so a change
in the parser or the collation that changes the drawing fails here instead of leaving the
page wrong.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
MARKER = re.compile(r"^<!--\s*output:\s*(?P<path>\S+)\s*-->$")


def shown_outputs() -> list[tuple[str, str, str]]:
    """``(page:line, script, shown text)`` for every marked block of the docs."""
    found = []
    for page in sorted((REPO / "docs").rglob("*.md")):
        lines = page.read_text().splitlines()
        for index, line in enumerate(lines):
            match = MARKER.match(line.strip())
            if match is None:
                continue
            where = f"{page.relative_to(REPO)}:{index + 1}"
            assert lines[index + 1].strip() == "```text", f"{where}: no ```text block follows"
            end = lines.index("```", index + 2)
            found.append((where, match["path"], "\n".join(lines[index + 2 : end])))
    return found


def test_the_env_mask_drawing_is_marked() -> None:
    assert "examples/docs/env_mask.py" in {script for _, script, _ in shown_outputs()}


@pytest.mark.parametrize(
    ("where", "script", "shown"), [pytest.param(*found, id=found[0]) for found in shown_outputs()]
)
def test_shown_output_is_what_the_script_prints(where: str, script: str, shown: str) -> None:
    done = subprocess.run(
        [sys.executable, str(REPO / script)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, f"{script} failed:\n{done.stderr[-3000:]}"
    printed = "\n".join(line.rstrip() for line in done.stdout.rstrip("\n").splitlines())
    assert printed == shown.rstrip("\n"), f"{where} shows other output than {script} prints"
