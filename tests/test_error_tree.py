"""The one exception tree: every ``NemoGymError`` of the package is drawn in ``errors.py``,
under its real parent, with the builtin it refines."""

from __future__ import annotations

import importlib
import pkgutil
import re

import nemogym_sdk
from nemogym_sdk import errors

# Modules whose framework is not installed in the SDK's own venv (axolotl runs in its own).
SKIPPED = ("nemogym_sdk.adapters.axolotl.args",)
_LINE = re.compile(r"^(?P<indent>[ │]*)(?:[├└]── )?(?P<name>\w+)(?:\((?P<builtin>[\w, ]+)\))?")


def drawn() -> dict[str, tuple[str | None, str | None]]:
    """class name -> (parent drawn above it, builtin in parentheses) from the docstring."""
    doc = errors.__doc__ or ""
    lines = [line for line in doc.split("::", 1)[1].splitlines() if line.strip()]
    tree: dict[str, tuple[str | None, str | None]] = {}
    stack: list[tuple[int, str]] = []
    for line in lines:
        body = line[4:]  # the block's indentation
        match = _LINE.match(body)
        if match is None or not match["name"].endswith("Error"):
            break
        depth = len(match["indent"]) // 4 + (0 if body.startswith(match["name"]) else 1)
        while stack and stack[-1][0] >= depth:
            stack.pop()
        parent = stack[-1][1] if stack else None
        tree[match["name"]] = (parent, match["builtin"])
        stack.append((depth, match["name"]))
    return tree


def package_errors() -> dict[str, type[BaseException]]:
    """Every public exception class of the package that is (or should be) a NemoGymError."""
    found: dict[str, type[BaseException]] = {}
    for info in pkgutil.walk_packages(nemogym_sdk.__path__, "nemogym_sdk."):
        if info.name in SKIPPED or ".envs." in info.name:
            continue
        module = importlib.import_module(info.name)
        for name, value in vars(module).items():
            if (
                isinstance(value, type)
                # not a BaseException-only signal (train.faults.Interrupted, a KeyboardInterrupt)
                and issubclass(value, Exception)
                and value.__module__ == info.name
                and not name.startswith("_")
            ):
                found[name] = value
    return found


def test_every_error_is_drawn_under_its_parent() -> None:
    tree = drawn()
    assert tree["NemoGymError"] == (None, None)
    classes = package_errors()
    missing = sorted(set(classes) - set(tree))
    assert not missing, f"errors.py does not draw {missing}"
    for name, cls in classes.items():
        assert issubclass(cls, errors.NemoGymError), f"{name} is not a NemoGymError"
        if cls is errors.NemoGymError:
            continue
        parent, builtin = tree[name]
        ours = [base for base in cls.__bases__ if issubclass(base, errors.NemoGymError)]
        assert [b.__name__ for b in ours] == [parent], f"{name}: drawn under {parent}"
        builtins = [b.__name__ for b in cls.__bases__ if b not in ours]
        assert builtins == ([b.strip() for b in builtin.split(",")] if builtin else []), name


def test_the_drawing_names_no_class_that_does_not_exist() -> None:
    assert set(drawn()) <= set(package_errors())
