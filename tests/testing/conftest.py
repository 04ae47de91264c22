"""The kit's pytest plugin, as a user enables it (re-exported: pytest_plugins belongs in
the top-level conftest only)."""

from nemogym_sdk.testing.pytest_plugin import nemo_gym_agent

__all__ = ["nemo_gym_agent"]
