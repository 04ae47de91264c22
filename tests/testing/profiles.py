"""Hypothesis settings for the kit's own tests."""

from __future__ import annotations

from hypothesis import Phase, settings

QUICK = settings(
    max_examples=(
        min(100, settings.default.max_examples)
        if settings.default.max_examples <= 300
        else settings.default.max_examples
    ),
    database=None,
    phases=[Phase.explicit, Phase.generate, Phase.target, Phase.shrink],
)
"""A few seconds per check in CI (no ``explain`` phase, no example database, 100 examples);
``make fuzz`` (HYPOTHESIS_PROFILE=fuzz) keeps its 10,000."""
