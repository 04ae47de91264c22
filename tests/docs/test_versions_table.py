"""The install page's "Versions tested" table names every version the Makefile pins.

The Makefile pins what CI installs into the venvs (``NEMO_GYM_SPEC``, ``VLLM_SPEC``,
``AXOLOTL_SPEC``, ``ROUTER_SPEC``, ``TORCH_SPEC``: ``name==version``); bumping one without
the table fails here, naming the pin and the page.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "install.md"
PINS = ("NEMO_GYM_SPEC", "VLLM_SPEC", "AXOLOTL_SPEC", "ROUTER_SPEC", "TORCH_SPEC")


def makefile_pins() -> dict[str, tuple[str, str]]:
    """``{variable: (package, version)}`` for every ``X_SPEC ?= package==version`` line."""
    text = (REPO / "Makefile").read_text()
    pins = re.findall(r"^(\w+_SPEC)\s*\?=\s*([A-Za-z0-9_.\-]+)==([^\s#]+)", text, re.MULTILINE)
    return {name: (package, version) for name, package, version in pins}


def versions_table() -> list[str]:
    """The rows of the table under the page's "Versions tested" heading."""
    section = PAGE.read_text().split("## Versions tested", 1)
    assert len(section) == 2, f"{PAGE} has no '## Versions tested' section"
    body = section[1].split("\n## ", 1)[0]
    return [line.lower() for line in body.splitlines() if line.startswith("|")]


def test_the_makefile_pins_what_the_table_is_checked_against() -> None:
    assert set(PINS) <= set(makefile_pins()), f"the Makefile lost a pin: {sorted(makefile_pins())}"


@pytest.mark.parametrize("variable", PINS)
def test_the_table_names_each_pinned_version(variable: str) -> None:
    package, version = makefile_pins()[variable]
    rows = [row for row in versions_table() if package.lower() in row]
    assert rows, f"docs/install.md's versions table has no row naming {package} ({variable})"
    cells = [cell.strip(" `") for row in rows for cell in re.split(r"[|\s]", row)]
    assert version.lower() in cells or f"{version}+cpu".lower() in cells, (
        f"the Makefile pins {package}=={version} ({variable}) but docs/install.md's "
        f"versions table says: {rows}"
    )
