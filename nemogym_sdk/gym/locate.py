"""Find and validate the separate Python venv that holds NeMo Gym.

NeMo Gym 0.7.0 needs Python 3.13, the SDK runs on 3.11, so NeMo Gym lives in a venv
of its own (``.venv-gym``, as NeMo Gym keeps a venv per server). The SDK never
imports it: it runs that venv's interpreter on the servers' ``app.py`` files and
talks to them over HTTP.

Lookup order: an explicit path, then ``$NEMOGYM_GYM_VENV``, then ``.venv-gym`` at the
root of the checkout that holds this package.

Environments come from two places: NeMo Gym's own (``resources_servers/<name>`` in the
venv) and the SDK's (``nemogym_sdk/gym/envs/<name>``, laid out the same way).
:func:`locate_environment` says which, and is the one place every other module asks.
"""

from __future__ import annotations

import os
from pathlib import Path

import attrs

from nemogym_sdk.errors import ConfigError
from nemogym_sdk.gym.errors import GymVenvNotFoundError

__all__ = [
    "GYM_VENV_ENV_VAR",
    "SDK_ENVS_DIR",
    "EnvironmentLocation",
    "GymVenv",
    "default_gym_venv_path",
    "find_gym_venv",
    "locate_environment",
    "sdk_environment_names",
]

GYM_VENV_ENV_VAR = "NEMOGYM_GYM_VENV"
"""Environment variable that overrides where the NeMo Gym venv is looked up."""

# The directory holding the nemogym_sdk package (the checkout, or site-packages when
# installed): ``.venv-gym`` is looked up there, and the dataset paths of the SDK's
# environments are relative to it, as NeMo Gym's are to its install root.
_REPO_ROOT = Path(__file__).resolve().parents[2]

SDK_ENVS_DIR = Path(__file__).resolve().with_name("envs")
"""Where environments shipped with the SDK live: ``nemogym_sdk/gym/envs/<name>/``."""


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


@attrs.frozen(kw_only=True)
class EnvironmentLocation:
    """Where an environment's resources server lives and what its relative paths mean."""

    name: str
    """Environment name as the user gave it: ``<directory>`` or ``<directory>:<config>``."""
    directory: Path
    """The resources server directory (``app.py``, ``configs/<name>.yaml``, ``data/``); the
    server process runs here."""
    root: Path
    """What relative paths in its config resolve against (datasets' ``jsonl_fpath``): the
    venv's site-packages for NeMo Gym's environments, the directory holding the
    ``nemogym_sdk`` package for the SDK's."""
    shipped_with_sdk: bool
    """True for an environment under ``nemogym_sdk/gym/envs``."""
    config_name: str | None = None
    """The config variant (``configs/<config_name>.yaml``); None: the directory's own name."""

    @property
    def config_path(self) -> Path:
        """``<directory>/configs/<config_name or directory name>.yaml``."""
        return self.directory / "configs" / f"{self.config_name or self.directory.name}.yaml"

    def resolve(self, relative: str | os.PathLike[str]) -> Path:
        """A path of its config (``jsonl_fpath``) as a file path; absolute paths stay."""
        return self.root / relative


def sdk_environment_names() -> tuple[str, ...]:
    """Names of the environments under ``nemogym_sdk/gym/envs``, sorted."""
    if not SDK_ENVS_DIR.is_dir():
        return ()
    return tuple(
        sorted(
            entry.name
            for entry in SDK_ENVS_DIR.iterdir()
            if entry.is_dir() and not entry.name.startswith(("_", "."))
        )
    )


def split_environment_name(name: str) -> tuple[str, str | None]:
    """``"structured_outputs:structured_outputs_json"`` -> (directory, config variant).

    A plain name selects ``configs/<name>.yaml``; ``<directory>:<config>`` selects
    ``configs/<config>.yaml`` of that directory (the environments whose configs are all
    variants, e.g. ``structured_outputs``, or another variant of one that has its own).
    """
    directory, sep, config = name.partition(":")
    for part in (directory, config) if sep else (directory,):
        if not part or part != Path(part).name or part.startswith(("_", ".")):
            raise ConfigError(
                f"{name!r} is not an environment name (<directory> or <directory>:<config>)"
            )
    return directory, (config if sep else None)


def locate_environment(venv: GymVenv, name: str) -> EnvironmentLocation:
    """Find environment ``name``: shipped with the SDK, else in the NeMo Gym venv.

    ``name`` is a resources server directory, optionally with a config variant
    (``<directory>:<config>``, see `split_environment_name`). The venv's location is
    returned even when it does not exist (callers report unknown environments with
    suggestions). A name that both ship is refused: which server runs must never depend
    on the installed NeMo Gym version.
    """
    directory, config_name = split_environment_name(name)
    in_venv = venv.resources_server_dir(directory)
    if directory in sdk_environment_names():
        if in_venv.exists():
            raise ConfigError(
                f"environment {name!r} exists both in nemogym_sdk ({SDK_ENVS_DIR / directory}) and "
                f"in the NeMo Gym venv ({in_venv}); an SDK environment must not share a name "
                "with a NeMo Gym one: rename the SDK's"
            )
        return EnvironmentLocation(
            name=name,
            directory=SDK_ENVS_DIR / directory,
            root=_REPO_ROOT,
            shipped_with_sdk=True,
            config_name=config_name,
        )
    return EnvironmentLocation(
        name=name,
        directory=in_venv,
        root=venv.site_packages,
        shipped_with_sdk=False,
        config_name=config_name,
    )
