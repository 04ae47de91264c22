"""The one place that says what the axolotl adapter needs and how to install it."""

from __future__ import annotations

from nemogym_sdk import _extras

__all__ = ["PLUGIN", "require_axolotl"]

PLUGIN = "the NeMo Gym axolotl plugin"


def require_axolotl() -> None:
    """Raise ``ImportError`` naming the extra unless axolotl and torch can be imported."""
    absent = _extras.missing(("torch", "axolotl"))
    if absent:
        raise ImportError(_extras.needs(PLUGIN, absent, "axolotl"))
