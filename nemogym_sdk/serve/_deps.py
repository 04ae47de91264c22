"""Check that the optional ``[serve]`` dependencies are installed, with an actionable message."""

from __future__ import annotations

import importlib.util

__all__ = ["SERVE_EXTRA_HINT", "require_serve_deps"]

SERVE_EXTRA_HINT = "pip install nemogym-sdk[serve]"
_REQUIRED = ("torch", "transformers", "tokenizers")


def require_serve_deps(*, extra: tuple[str, ...] = ()) -> None:
    """Raise ``ImportError`` naming the ``[serve]`` extra if a serving dependency is missing."""
    missing = [name for name in (*_REQUIRED, *extra) if importlib.util.find_spec(name) is None]
    if missing:
        raise ImportError(
            f"nemogym_sdk.serve needs {', '.join(missing)}, which is not installed. "
            f"Install the serving extra: `{SERVE_EXTRA_HINT}`."
        )
