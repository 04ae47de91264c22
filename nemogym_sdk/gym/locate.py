"""Find and validate the separate Python venv that holds NeMo Gym.

NeMo Gym 0.7.0 needs Python 3.13, the SDK runs on 3.11, so NeMo Gym lives in a venv
of its own (``.venv-gym``, as NeMo Gym keeps a venv per server). The SDK never
imports it: it runs that venv's interpreter on the servers' ``app.py`` files and
talks to them over HTTP.

Lookup order: an explicit path, then ``$NEMOGYM_GYM_VENV``, then ``.venv-gym`` at the
root of the checkout that holds this package.

Environments come from three places, searched in this order: the environment search path
(``env_path``, else ``$NEMOGYM_ENV_PATH``: directories holding users' own environments,
``<dir>/<name>``), the SDK's (``nemogym_sdk/gym/envs/<name>``) and NeMo Gym's
(``resources_servers/<name>`` in the venv), all laid out the same way.
:func:`locate_environment` says which, and is the one place every other module asks.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Sequence
from pathlib import Path

import attrs

from nemogym_sdk.errors import DOCS_URL, ConfigError
from nemogym_sdk.gym.errors import GymVenvNotFoundError

__all__ = [
    "ENV_PATH_ENV_VAR",
    "GYM_VENV_ENV_VAR",
    "SDK_ENVS_DIR",
    "EnvironmentLocation",
    "GymVenv",
    "default_gym_venv_path",
    "environment_not_found",
    "environment_path",
    "find_gym_venv",
    "locate_environment",
    "sdk_environment_names",
]

GYM_VENV_ENV_VAR = "NEMOGYM_GYM_VENV"
"""Environment variable that overrides where the NeMo Gym venv is looked up."""

ENV_PATH_ENV_VAR = "NEMOGYM_ENV_PATH"
"""Environment variable holding the environment search path (directories, separated by
``os.pathsep``), read when no ``env_path`` is given."""

_ADD_ONE = (
    "To use an environment of your own, put its directory (<name>/configs/<name>.yaml, "
    "<name>/app.py, <name>/data/example.jsonl) in a directory named by GymStack's or "
    f"GymLauncher's env_path, ${ENV_PATH_ENV_VAR} or nemogym-train --env-path "
    "(docs/writing-an-environment.md)"
)

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


_PYTHON_313 = (
    "(no python3.13? under pyenv: `pyenv install 3.13`, then use "
    "`$(pyenv prefix 3.13)/bin/python -m venv`)"
)
_GYM_PIP = "pip install --ignore-requires-python nemo-gym==0.7.0"


def _venv_hint(root: Path, chosen: bool) -> str:
    """How to make the venv: where the user chose it (a path, ``$NEMOGYM_GYM_VENV``), there;
    else the install page's recipe, anywhere and then the variable (the default,
    ``.venv-gym`` beside the package, is a checkout's: inside ``site-packages`` after a pip
    install)."""
    if chosen:
        create = f"python3.13 -m venv {root} && {root}/bin/{_GYM_PIP}"
        return f"Create it there with `{create}` {_PYTHON_313}."
    recipe = (
        f"python3.13 -m venv ~/venvs/nemo-gym && ~/venvs/nemo-gym/bin/{_GYM_PIP} && "
        f"export {GYM_VENV_ENV_VAR}=~/venvs/nemo-gym"
    )
    return (
        f"Create one anywhere and point ${GYM_VENV_ENV_VAR} at it: `{recipe}` {_PYTHON_313}. "
        "In a checkout of nemogym_sdk, `make gym-venv` builds the default one. "
        f"See {DOCS_URL}install/."
    )


def find_gym_venv(path: str | os.PathLike[str] | None = None) -> GymVenv:
    """Locate and validate the NeMo Gym venv.

    ``path`` wins over ``$NEMOGYM_GYM_VENV``, which wins over ``<repo>/.venv-gym``.
    Raises :class:`GymVenvNotFoundError` saying what is missing and how to fix it.
    """
    root = Path(path).expanduser() if path is not None else default_gym_venv_path()
    chosen = path is not None or bool(os.environ.get(GYM_VENV_ENV_VAR))
    hint = _venv_hint(root, chosen)
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
    ``nemogym_sdk`` package for the SDK's, the search-path directory it was found in for a
    user's (its parent when that directory is named ``resources_servers``, as in NeMo Gym)."""
    shipped_with_sdk: bool
    """True for an environment under ``nemogym_sdk/gym/envs``."""
    config_name: str | None = None
    """The config variant (``configs/<config_name>.yaml``); None: the directory's own name."""
    path_entry: Path | None = None
    """The search-path directory it was found in (:func:`environment_path`); None for the
    SDK's and NeMo Gym's environments."""

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


def environment_path(
    env_path: Sequence[str | os.PathLike[str]] | None = None,
) -> tuple[Path, ...]:
    """The directories searched for users' environments, absolute, in order, each once.

    ``env_path`` when given (empty: none), else ``$NEMOGYM_ENV_PATH`` split on
    ``os.pathsep`` (empty parts skipped). An entry that is not an existing directory is a
    ``ConfigError`` naming it and where it came from.
    """
    if isinstance(env_path, (str, os.PathLike)):
        raise ConfigError(
            f"env_path must be a sequence of directories, e.g. [{str(env_path)!r}], not one path"
        )
    source = "env_path"
    if env_path is None:
        source = f"${ENV_PATH_ENV_VAR}"
        env_path = [part for part in os.environ.get(ENV_PATH_ENV_VAR, "").split(os.pathsep) if part]
    entries: list[Path] = []
    for entry in env_path:
        directory = Path(os.path.abspath(Path(entry).expanduser()))
        if not directory.is_dir():
            what = "is not a directory" if directory.exists() else "does not exist"
            raise ConfigError(
                f"{directory} (in {source}) {what}; the environment search path names "
                "directories that hold environment directories (<dir>/<name>/configs/"
                f"<name>.yaml): create it or remove it from {source}"
            )
        if directory not in entries:
            entries.append(directory)
    return tuple(entries)


def locate_environment(
    venv: GymVenv, name: str, env_path: Sequence[str | os.PathLike[str]] | None = None
) -> EnvironmentLocation:
    """Find environment ``name``: on the search path, else shipped with the SDK, else in
    the NeMo Gym venv.

    ``name`` is a resources server directory, optionally with a config variant
    (``<directory>:<config>``, see `split_environment_name`). ``env_path`` is the search
    path (see :func:`environment_path`; ``None``: ``$NEMOGYM_ENV_PATH``): its first
    directory holding a directory of that name wins, over the SDK's and NeMo Gym's too (a
    user's copy shadows a shipped environment, as ``NEMO_GYM_EXTRA_ROOTS`` does in NeMo
    Gym). The venv's location is returned even when it does not exist (callers report
    unknown environments with :func:`environment_not_found`). A name that the SDK and
    NeMo Gym both ship is refused: which server runs must never depend on the installed
    NeMo Gym version.
    """
    directory, config_name = split_environment_name(name)
    for entry in environment_path(env_path):
        if (entry / directory).is_dir():
            return EnvironmentLocation(
                name=name,
                directory=entry / directory,
                root=entry.parent if entry.name == "resources_servers" else entry,
                shipped_with_sdk=False,
                config_name=config_name,
                path_entry=entry,
            )
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


def environment_not_found(
    venv: GymVenv, location: EnvironmentLocation, env_path: Sequence[str | os.PathLike[str]] | None
) -> ConfigError:
    """The error for an environment whose config is not there: a directory without configs,
    or a name found nowhere (every place searched, close names, how to add one)."""
    name = location.name
    if location.directory.is_dir():
        return ConfigError(
            f"environment {name!r}: {location.directory} has no configs/*.yaml, so it is not "
            f"an environment directory (expected {location.config_path})"
        )
    searched = [
        *environment_path(env_path),
        SDK_ENVS_DIR,
        venv.resources_server_dir(location.directory.name).parent,
    ]
    known = sorted(
        {config.parent.parent.name for d in searched for config in d.glob("*/configs/*.yaml")}
    )
    close = difflib.get_close_matches(location.directory.name, known, n=3)
    hint = f"; did you mean {', '.join(map(repr, close))}?" if close else ""
    return ConfigError(
        f"unknown NeMo Gym environment {name!r}: no directory {location.directory.name!r} "
        f"in {', '.join(map(str, searched))} ({len(known)} environments there{hint}). "
        f"{_ADD_ONE}"
    )
