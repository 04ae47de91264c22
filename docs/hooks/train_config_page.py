"""mkdocs hook: the page of `nemogym-train`'s settings, written from `TrainConfig` when built.

Every field of ``nemogym_sdk.train.config.TrainConfig`` is a row (key, flag, type, default,
what it does); the text is the field's docstring, read from the source with ``ast``, so the
page cannot go stale. mkdocs loads this file through ``hooks:`` in ``mkdocs.yml``; the docs
tests import it too (``tests/docs``).
"""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path
from typing import Any

import attrs

from nemogym_sdk.train import config as train_config
from nemogym_sdk.train.config import TrainConfig

PAGE = "reference/train-config.md"
"""Where the page goes in the site (the nav names it)."""

_RST_LITERAL = re.compile(r"``(.+?)``")


def field_docstrings() -> dict[str, str]:
    """Each ``TrainConfig`` field's docstring, by field name (``--help`` shows the same)."""
    return train_config.field_docs()


def field_types() -> dict[str, str]:
    """Each field's annotation as written in the source."""
    tree = ast.parse(Path(inspect.getfile(train_config)).read_text())
    (cls,) = (n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "TrainConfig")
    return {
        node.target.id: ast.unparse(node.annotation)
        for node in cls.body
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
    }


def _default(value: Any) -> str:
    """The default as one writes it in the YAML file or on the command line."""
    if value is None:
        return "*(none)*"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, tuple):
        return f"`{','.join(map(str, value))}`" if value else "*(empty)*"
    return f"`{value}`"


def _cell(text: str) -> str:
    """Docstring text as one markdown table cell (a ``|`` outside code escaped)."""
    parts = " ".join(_RST_LITERAL.sub(r"`\1`", text).split()).split("`")
    return "`".join(p.replace("|", "\\|") if i % 2 == 0 else p for i, p in enumerate(parts))


def page_markdown() -> str:
    """The whole page."""
    docs, types = field_docstrings(), field_types()
    lines = [
        "# `nemogym-train` settings",
        "",
        "Every setting of the reference trainer (`nemogym-train`, `python -m "
        "nemogym_sdk.train`). Give them in a YAML file (`--config run.yaml`, keys as below) "
        "and/or as flags; a flag overrides the file. A wrong value stops the run before "
        "anything starts, with a [`ConfigError`](../troubleshooting.md#configerror) that says "
        "what to change. Lists take commas on the command line (`--head-url a,b`); booleans "
        "take `--flag` / `--no-flag`.",
        "",
        "*Generated from `nemogym_sdk/train/config.py` when the site is built.*",
        "",
        "| key | flag | type | default | what it does |",
        "|---|---|---|---|---|",
    ]
    for field in attrs.fields(TrainConfig):
        flag = "--" + field.name.replace("_", "-")
        if field.type in (bool, "bool"):
            flag = f"{flag}` / `--no-{flag[2:]}"
        kind = types.get(field.name, "")
        lines.append(
            f"| `{field.name}` | `{flag}` | `{kind}` | {_default(field.default)} "
            f"| {_cell(docs.get(field.name, ''))} |"
        )
    lines += ["", "::: nemogym_sdk.train.config.parse_config", ""]
    return "\n".join(lines)


def on_files(files: Any, config: Any) -> Any:
    """mkdocs event: add the generated page to the site's files."""
    from mkdocs.structure.files import File

    files.append(File.generated(config, PAGE, content=page_markdown()))
    return files
