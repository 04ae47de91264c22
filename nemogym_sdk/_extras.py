"""The one place that says how to install an optional extra, and which modules are missing.

Every "this needs X" message of the package is built here, so each names the same
``pip install 'nemogym-sdk[extra]'`` and, where torch is missing, how to get the CPU build
(a plain ``pip install torch`` downloads a multi-GB CUDA build).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterable

__all__ = ["CPU_TORCH", "TORCH_CPU_INDEX", "install", "missing", "needs"]

DISTRIBUTION = "nemogym-sdk"
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
"""PyTorch's index of CPU-only builds (PyPI's ``torch`` on Linux is the multi-GB CUDA one)."""
CPU_TORCH = (
    "on a CPU-only machine, install the CPU build of torch first: "
    f"pip install torch==2.13.0 --index-url {TORCH_CPU_INDEX}"
)


def install(extra: str) -> str:
    """``pip install 'nemogym-sdk[extra]'``."""
    return f"pip install '{DISTRIBUTION}[{extra}]'"


def missing(modules: Iterable[str]) -> list[str]:
    """Those of ``modules`` that are not installed (found, not imported: no import cost)."""
    return [name for name in modules if importlib.util.find_spec(name) is None]


def needs(what: str, absent: Iterable[str], extra: str, *, instead: str = "") -> str:
    """``"<what> needs a and b: pip install 'nemogym-sdk[extra]'"``, with the CPU torch hint
    when torch is among ``absent`` and ``instead`` (another way out) in parentheses."""
    names = list(absent)
    listed = " and ".join(names) if len(names) < 3 else f"{', '.join(names[:-1])} and {names[-1]}"
    notes = [note for note in (instead, CPU_TORCH if "torch" in names else "") if note]
    tail = "".join(f" ({note})" for note in notes)
    return f"{what} needs {listed}: {install(extra)}{tail}"
