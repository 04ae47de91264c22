"""Deprecated alias of :mod:`nemogym_sdk.train.config`, kept for one release.

The reference trainer moved into the package ``nemogym_sdk.train``: its settings are in
``nemogym_sdk.train.config`` (``TrainConfig``, ``parse_config`` ...), the recipe in
``nemogym_sdk.train.recipe``. This module re-exports the settings' public names and will be
removed in the next release; it warns nothing at import (see CHANGELOG.md).
"""

from __future__ import annotations

from nemogym_sdk.train.config import (
    BACKENDS,
    DTYPES,
    LAUNCHERS,
    LOSSES,
    MODES,
    TRACKERS,
    TrainConfig,
    field_docs,
    parse_config,
    resolve_device,
)

__all__ = [
    "BACKENDS",
    "DTYPES",
    "LAUNCHERS",
    "LOSSES",
    "MODES",
    "TRACKERS",
    "TrainConfig",
    "field_docs",
    "parse_config",
    "resolve_device",
]
