"""Which TRL this adapter works with, checked once, with errors that say what to install."""

from __future__ import annotations

import re
from types import ModuleType

from nemogym_sdk import _extras
from nemogym_sdk.errors import NemoGymError

__all__ = [
    "MAX_TRL_EXCLUSIVE",
    "MIN_TRL",
    "TESTED_TRL",
    "UnsupportedTRLError",
    "check_trl_version",
    "import_trl",
]

MIN_TRL = (1, 6)
"""Oldest supported TRL: ``rollout_func(prompts, trainer)`` on every process with its own
slice (1.0) and reward functions that return ``None`` for an unscorable completion (1.6)."""
MAX_TRL_EXCLUSIVE = (2, 0)
"""First unsupported major version: ``rollout_func`` is experimental and its contract has
changed between minors before, so a new major is refused rather than guessed at."""
TESTED_TRL = "1.16.0"
"""The release the CI run trains with."""

_INSTALL_HINT = _extras.install("trl")


class UnsupportedTRLError(NemoGymError, ImportError):
    """The installed TRL is outside the range this adapter supports."""


def _parse(version: str) -> tuple[int, ...]:
    match = re.match(r"(\d+)\.(\d+)", version)
    if match is None:
        raise UnsupportedTRLError(f"cannot read the TRL version {version!r}; {_INSTALL_HINT}")
    return int(match.group(1)), int(match.group(2))


def check_trl_version(version: str) -> tuple[int, ...]:
    """``version`` as ``(major, minor)``; raises ``UnsupportedTRLError`` outside the range.

    >>> check_trl_version("1.16.0")
    (1, 16)
    """
    parsed = _parse(version)
    if not MIN_TRL <= parsed < MAX_TRL_EXCLUSIVE:
        low = ".".join(map(str, MIN_TRL))
        high = ".".join(map(str, MAX_TRL_EXCLUSIVE))
        raise UnsupportedTRLError(
            f"nemogym_sdk.adapters.trl supports trl>={low},<{high} (tested with {TESTED_TRL}); "
            f"found trl {version}. TRL's rollout_func contract differs outside this range "
            f"(before 1.6 a failed rollout cannot be marked unscorable). "
            f"Install a supported one: pip install 'trl>={low},<{high}' or {_INSTALL_HINT}"
        )
    return parsed


def import_trl() -> ModuleType:
    """The ``trl`` module, after checking its version."""
    try:
        import trl
    except ImportError as exc:
        raise ImportError(
            f"nemogym_sdk.adapters.trl needs TRL, transformers and torch: {_INSTALL_HINT} "
            f"({_extras.CPU_TORCH})"
        ) from exc
    check_trl_version(str(getattr(trl, "__version__", "unknown")))
    return trl
