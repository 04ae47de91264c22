"""Where the SDK's caches live on this machine (stdlib only)."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["user_cache"]


def user_cache(env_var: str, name: str) -> Path:
    """``$<env_var>`` when set, else ``$XDG_CACHE_HOME/nemogym_sdk/<name>`` (``~/.cache``
    without ``XDG_CACHE_HOME``)."""
    override = os.environ.get(env_var)
    if override:
        return Path(override).expanduser()
    cache_home = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache_home).expanduser() / "nemogym_sdk" / name
