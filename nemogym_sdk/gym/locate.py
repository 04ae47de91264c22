"""Find and validate the separate Python venv that holds NeMo Gym.

NeMo Gym 0.7.0 needs Python 3.13, the SDK runs on 3.11, so NeMo Gym lives in a venv
of its own (``.venv-gym``, as NeMo Gym keeps a venv per server). The SDK never
imports it: it runs that venv's interpreter on the servers' ``app.py`` files and
talks to them over HTTP.

Lookup order: an explicit path, then ``$NEMOGYM_GYM_VENV``, then ``.venv-gym`` at the
root of the checkout that holds this package.
"""

from __future__ import annotations

import os
from pathlib import Path

import attrs

from nemogym_sdk.gym.errors import GymVenvNotFoundError

__all__ = ["GYM_VENV_ENV_VAR", "GymVenv", "default_gym_venv_path", "find_gym_venv"]

GYM_VENV_ENV_VAR = "NEMOGYM_GYM_VENV"
"""Environment variable that overrides where the NeMo Gym venv is looked up."""

_REPO_ROOT = Path(__file__).resolve().parents[2]


@attrs.frozen(kw_only=True)
class GymVenv:
    """A validated venv with nemo-gym installed."""

    root: Path
    """The venv directory (absolute)."""
    python: Path
    """Its interpreter, ``<root>/bin/python``."""
    site_packages: Path
    """Where the wheel put ``nemo_gym``, ``resources_servers``, ``responses_api_agents`` ..."""

    def server_dir(self, server_type: str, impl: str) -> Path:
        """The directory of a server implementation, e.g. ``responses_api_agents/simple_agent``."""
        return self.site_packages / server_type / impl

    def resources_server_dir(self, environment: str) -> Path:
        """The directory of an environment's resources server (its configs and data live here)."""
        return self.server_dir("resources_servers", environment)


def default_gym_venv_path() -> Path:
    """Where the venv is expected: ``$NEMOGYM_GYM_VENV``, else ``<repo>/.venv-gym``."""
    override = os.environ.get(GYM_VENV_ENV_VAR)
    if override:
        return Path(override).expanduser()
    return _REPO_ROOT / ".venv-gym"


def find_gym_venv(path: str | os.PathLike[str] | None = None) -> GymVenv:
    """Locate and validate the NeMo Gym venv.

    ``path`` wins over ``$NEMOGYM_GYM_VENV``, which wins over ``<repo>/.venv-gym``.
    Raises :class:`GymVenvNotFoundError` saying what is missing and how to fix it.
    """
    root = Path(path).expanduser() if path is not None else default_gym_venv_path()
    hint = (
        f"Create it with `python3.13 -m venv {root} && {root}/bin/pip install "
        f"--ignore-requires-python nemo-gym==0.7.0`, or point ${GYM_VENV_ENV_VAR} at an "
        "existing one."
    )
    if not root.is_dir():
        raise GymVenvNotFoundError(f"NeMo Gym venv not found at {root}. {hint}")
    # Keep the venv path itself (not its resolved target): a venv interpreter is
    # usually a symlink, and resolving it would escape the venv.
    root = Path(os.path.abspath(root))
    python = root / "bin" / "python"
    if not python.exists():
        raise GymVenvNotFoundError(f"{root} has no bin/python, so it is not a venv. {hint}")
    candidates = sorted(root.glob("lib/python3*/site-packages/nemo_gym/__init__.py"))
    if not candidates:
        raise GymVenvNotFoundError(f"{root} is a venv but nemo-gym is not installed in it. {hint}")
    site_packages = candidates[-1].parent.parent
    return GymVenv(root=root, python=python, site_packages=site_packages)
