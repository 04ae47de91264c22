"""Every import path the documentation shows still works.

Collected from README.md, docs/**/*.md (and the docs' hooks), examples/**/*.py and the
docstring of ``nemogym_sdk/__init__.py``: each ``from nemogym_sdk... import a, b``, each
``import nemogym_sdk...`` and each mkdocstrings directive ``::: nemogym_sdk...``. Each is
imported (the names looked up) in this interpreter, which has every extra installed, so a
module that moves without its documented path moving too fails here.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path
from typing import Any

import pytest

import nemogym_sdk

REPO = Path(__file__).resolve().parents[1]
SOURCES = [
    REPO / "README.md",
    *sorted((REPO / "docs").rglob("*.md")),
    *sorted((REPO / "docs" / "hooks").glob("*.py")),  # the directives a hook writes
    *sorted((REPO / "examples").rglob("*.py")),
]
_FROM = re.compile(
    r"^[ \t>]*from[ \t]+(nemogym_sdk(?:\.\w+)*)[ \t]+import[ \t]+(\([^)]*\)|[^\n#;]+)", re.M
)
_IMPORT = re.compile(r"^[ \t>]*import[ \t]+(nemogym_sdk(?:\.\w+)*)", re.M)
_DIRECTIVE = re.compile(r"^:::[ \t]+(nemogym_sdk(?:\.\w+)*)", re.M)
_DIRECTIVE_IN_CODE = re.compile(r"[\"']::: (nemogym_sdk(?:\.\w+)*)")  # written by a hook

# Frameworks that run in venvs of their own, not in the SDK's (``make axolotl-venv``).
OWN_VENV = frozenset({"axolotl"})


def documented_paths(text: str) -> set[str]:
    """Dotted paths (``module`` or ``module.name``) that ``text`` imports or documents."""
    found: set[str] = set()
    for module, names in _FROM.findall(text):
        for name in names.strip("()").replace("\n", " ").split(","):
            name = name.split(" as ")[0].strip()
            if name and name != "*" and name.isidentifier():
                found.add(f"{module}.{name}")
    found.update(_IMPORT.findall(text))
    found.update(_DIRECTIVE.findall(text))
    found.update(_DIRECTIVE_IN_CODE.findall(text))
    return found


def _collected() -> dict[str, list[str]]:
    """Dotted path -> the files that show it."""
    where: dict[str, list[str]] = {}
    texts = [(path.relative_to(REPO).as_posix(), path.read_text()) for path in SOURCES]
    texts.append(("nemogym_sdk/__init__.py (docstring)", nemogym_sdk.__doc__ or ""))
    for name, text in texts:
        for dotted in documented_paths(text):
            where.setdefault(dotted, []).append(name)
    return where


DOCUMENTED = _collected()


def resolve(dotted: str) -> Any:
    """Import the longest importable module prefix of ``dotted``, then look the rest up."""
    parts = dotted.split(".")
    for end in range(len(parts), 0, -1):
        module_name = ".".join(parts[:end])
        try:
            value: Any = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name is not None and (
                module_name == exc.name or module_name.startswith(exc.name + ".")
            ):
                continue  # not a module: a name in its parent
            raise
        for attr in parts[end:]:
            value = getattr(value, attr)
        return value
    raise ModuleNotFoundError(dotted)


def test_the_collector_finds_each_form() -> None:
    text = (
        "from nemogym_sdk.gym import (\n    GymStack,\n    PolicyModel as P,\n)\n"
        "    import nemogym_sdk.samplers\n::: nemogym_sdk.rollout_engine\n"
        '    lines = ["::: nemogym_sdk.train.config.parse_config"]\n'
        "the `::: nemogym_sdk.X` directive, in prose\n"
    )
    assert documented_paths(text) == {
        "nemogym_sdk.gym.GymStack",
        "nemogym_sdk.gym.PolicyModel",
        "nemogym_sdk.samplers",
        "nemogym_sdk.rollout_engine",
        "nemogym_sdk.train.config.parse_config",
    }
    assert len(DOCUMENTED) > 50, sorted(DOCUMENTED)


@pytest.mark.parametrize("dotted", sorted(DOCUMENTED))
def test_a_documented_import_path_resolves(dotted: str) -> None:
    """The path a page or an example shows imports (its files are in the failure)."""
    try:
        resolve(dotted)
    except ModuleNotFoundError as exc:
        if exc.name is not None and exc.name.split(".")[0] in OWN_VENV:
            pytest.skip(f"{exc.name} runs in its own venv")
        raise AssertionError(f"{dotted} (shown in {DOCUMENTED[dotted]}): {exc}") from exc
    except AttributeError as exc:
        raise AssertionError(f"{dotted} (shown in {DOCUMENTED[dotted]}): {exc}") from exc


def test_the_deprecated_train_config_alias_is_the_new_module() -> None:
    import nemogym_sdk.train.config
    import nemogym_sdk.train_config

    assert nemogym_sdk.train_config.TrainConfig is nemogym_sdk.train.config.TrainConfig
