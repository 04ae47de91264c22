"""``tests.require.absent``: skip for users, fail in CI (``NEMOGYM_REQUIRE_GYM=1``)."""

from __future__ import annotations

import pytest

from tests.require import REQUIRE_ENV_VAR, absent


def test_absent_venv_skips_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the variable an absent venv is a skip carrying the reason."""
    monkeypatch.delenv(REQUIRE_ENV_VAR, raising=False)
    with pytest.raises(pytest.skip.Exception, match="venv absent"):
        absent("venv absent")


def test_absent_venv_fails_when_required(monkeypatch: pytest.MonkeyPatch) -> None:
    """With ``NEMOGYM_REQUIRE_GYM=1`` the same absence fails the test, naming the variable."""
    monkeypatch.setenv(REQUIRE_ENV_VAR, "1")
    with pytest.raises(pytest.fail.Exception, match="NEMOGYM_REQUIRE_GYM=1"):
        absent("venv absent")
