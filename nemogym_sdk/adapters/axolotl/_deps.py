"""The one place that says what the axolotl adapter needs and how to install it."""

from __future__ import annotations

import importlib.util

__all__ = ["INSTALL_HINT", "require_axolotl"]

INSTALL_HINT = "pip install 'nemogym-sdk[axolotl]'"


def require_axolotl() -> None:
    """Raise ``ImportError`` naming the extra unless axolotl and torch can be imported."""
    missing = [name for name in ("torch", "axolotl") if importlib.util.find_spec(name) is None]
    if missing:
        raise ImportError(
            f"the NeMo Gym axolotl plugin needs {' and '.join(missing)}: {INSTALL_HINT} "
            "(on a CPU-only machine install the CPU build of torch first: "
            "pip install torch==2.13.0)"
        )
