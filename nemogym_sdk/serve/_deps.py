"""Check that the optional ``[serve]`` dependencies are installed, with an actionable message."""

from __future__ import annotations

import importlib.util

__all__ = ["SERVE_EXTRA_HINT", "require_serve_deps"]

SERVE_EXTRA_HINT = "pip install 'nemogym-sdk[serve]'"
_REQUIRED = ("torch", "transformers", "tokenizers", "jinja2")
_CPU_TORCH_HINT = (
    " (on a CPU-only machine, the CPU build of torch first: pip install torch==2.13.0)."
)


def require_serve_deps(*, extra: tuple[str, ...] = ()) -> None:
    """Raise ``ImportError`` naming the ``[serve]`` extra if a serving dependency is missing."""
    missing = [name for name in (*_REQUIRED, *extra) if importlib.util.find_spec(name) is None]
    if missing:
        raise ImportError(
            f"nemogym_sdk.serve needs {', '.join(missing)} (not installed). "
            f"Install the serving extra: `{SERVE_EXTRA_HINT}`"
            + (_CPU_TORCH_HINT if "torch" in missing else ".")
        )
