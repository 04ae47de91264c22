"""Check that the optional ``[serve]`` dependencies are installed, with an actionable message."""

from __future__ import annotations

from nemogym_sdk import _extras

__all__ = ["require_serve_deps"]

_REQUIRED = ("torch", "transformers", "tokenizers", "jinja2")


def require_serve_deps(*, extra: tuple[str, ...] = ()) -> None:
    """Raise ``ImportError`` naming the ``[serve]`` extra if a serving dependency is missing."""
    absent = _extras.missing((*_REQUIRED, *extra))
    if absent:
        raise ImportError(_extras.needs("nemogym_sdk.serve", absent, "serve"))
