"""Per-server venvs: each NeMo Gym server runs in an environment holding its requirements.

NeMo Gym's launcher gives every server a venv of its own, built with ``uv`` from the
requirements :func:`~nemogym_sdk.gym.requirements.read_server_requirements` reads, with
nemo-gym itself pinned to the installed version and the parent's ``openai`` and
``ray[default]`` pinned. This module does the same for ``GymStack``, without ever writing
into the NeMo Gym venv or the installed package: :func:`prepare_server_environment`
returns the interpreter a server runs with: the NeMo Gym venv's when the server needs
nothing beyond nemo-gym, else the one of a venv under the cache root, built on first use
and reused after.

Cache: ``<root>/<impl>-<key>``, where ``key`` hashes the filtered requirements (and the
content of the files and local packages they name), the nemo-gym version and the
Python interpreter. A venv is used only once its stamp file exists, written after a
successful install; a half-built one (a crash, a kill) is deleted and rebuilt. Builds
take a file lock per venv, so concurrent starts (two test processes) build it once.
The root is ``$NEMOGYM_SERVER_ENVS``, else ``$XDG_CACHE_HOME/nemogym_sdk/server-envs``
(``~/.cache/...``); ``GymStack(requirements_cache=...)`` overrides both.

Example::

    env = prepare_server_environment(find_gym_venv(), "resources_servers", "math_with_judge")
    env.python      # <root>/math_with_judge-<key>/bin/python (math-verify installed)
    env.reused      # False the first time, True after
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import attrs

from nemogym_sdk._cache import user_cache
from nemogym_sdk._filelock import exclusive
from nemogym_sdk.errors import ConfigError
from nemogym_sdk.gym.errors import RequirementsInstallError, UvNotFoundError
from nemogym_sdk.gym.locate import GymVenv, locate_environment
from nemogym_sdk.gym.requirements import ServerRequirements, read_server_requirements
from nemogym_sdk.gym.specs import RESOURCES
from nemogym_sdk.processes import tail

__all__ = [
    "REQUIREMENTS_CACHE_ENV_VAR",
    "STAMP_NAME",
    "ServerEnvironment",
    "default_requirements_cache",
    "environment_key",
    "find_uv",
    "nemo_gym_version",
    "prepare_server_environment",
]

logger = logging.getLogger(__name__)

REQUIREMENTS_CACHE_ENV_VAR = "NEMOGYM_SERVER_ENVS"
"""Environment variable naming the directory that holds the per-server venvs."""

STAMP_NAME = ".nemogym-sdk-ready"
"""File written into a per-server venv once its install succeeded (JSON: what it holds)."""

_FORMAT = 1  # bump when the layout or the install recipe changes: old venvs are not reused


@attrs.frozen(kw_only=True)
class ServerEnvironment:
    """The interpreter a server runs with, and where it came from."""

    server: str
    """``<server_type>/<impl>``."""
    python: Path
    """The interpreter to run the server's entry point with."""
    root: Path | None
    """The per-server venv; ``None`` when the server runs in the NeMo Gym venv."""
    reused: bool
    """True when an already built venv was used (or none was needed); False after a build."""
    seconds: float = 0.0
    """Time the build took (0 when reused)."""

    @property
    def shared(self) -> bool:
        """True when the server runs in the NeMo Gym venv itself."""
        return self.root is None


def default_requirements_cache() -> Path:
    """``$NEMOGYM_SERVER_ENVS``, else ``$XDG_CACHE_HOME/nemogym_sdk/server-envs``."""
    return user_cache(REQUIREMENTS_CACHE_ENV_VAR, "server-envs")


def find_uv() -> list[str]:
    """The command that runs uv: the ``uv`` beside this interpreter, on ``PATH``, or
    ``python -m uv``. Raises :class:`UvNotFoundError` saying how to install it."""
    beside = Path(sys.executable).parent / "uv"
    if beside.is_file() and os.access(beside, os.X_OK):
        return [str(beside)]
    on_path = shutil.which("uv")
    if on_path:
        return [on_path]
    if importlib.util.find_spec("uv") is not None:
        return [sys.executable, "-m", "uv"]
    raise UvNotFoundError(
        "uv is needed to install NeMo Gym servers' requirements but was not found beside "
        f"{sys.executable}, on PATH, or as a module: `pip install uv` (or install "
        "nemogym-sdk with its `gym` extra), or pass install_requirements=False to GymStack "
        "to run every server in the NeMo Gym venv as it is"
    )


def prepare_server_environment(
    venv: GymVenv,
    server_type: str,
    impl: str,
    *,
    server_dir: Path | None = None,
    cache_root: str | os.PathLike[str] | None = None,
    uv: Sequence[str] | None = None,
    env: Mapping[str, str] | None = None,
) -> ServerEnvironment:
    """The interpreter server ``<server_type>/<impl>`` runs with, its venv built if needed.

    ``server_dir`` defaults to where the server lives (SDK environments included, see
    :func:`~nemogym_sdk.gym.locate.locate_environment`). ``cache_root`` defaults to
    :func:`default_requirements_cache`, ``uv`` to :func:`find_uv` (found only when an
    install is needed), ``env`` (uv's environment) to this process's. A server needing
    nothing beyond nemo-gym gets the NeMo Gym venv's interpreter. Raises
    :class:`~nemogym_sdk.gym.errors.RequirementsInstallError` naming the server, the
    requirements file and uv's output when the install fails.
    """
    if server_dir is None:
        if server_type == RESOURCES:
            server_dir = locate_environment(venv, impl).directory
        else:
            server_dir = venv.server_dir(server_type, impl)
    server = f"{server_type}/{impl}"
    wanted = read_server_requirements(server_dir, server)
    if not wanted.needs_environment:
        return ServerEnvironment(server=server, python=venv.python, root=None, reused=True)
    gym_version = nemo_gym_version(venv)
    python_version = _python_version(venv)
    key = environment_key(wanted, gym_version, python_version, _base_interpreter(venv))
    root = Path(cache_root) if cache_root is not None else default_requirements_cache()
    target = root.absolute() / f"{_file_safe(impl)}-{key}"
    python = target / "bin" / "python"
    if _is_ready(target):
        return ServerEnvironment(server=server, python=python, root=target, reused=True)
    root.mkdir(parents=True, exist_ok=True)
    waiting = functools.partial(
        logger.info, "waiting for another process building the venv of %s", server
    )
    with exclusive(target.with_name(target.name + ".lock"), on_wait=waiting):
        if _is_ready(target):  # another process built it while we waited
            return ServerEnvironment(server=server, python=python, root=target, reused=True)
        began = time.monotonic()
        logger.info(
            "installing requirements for %s (%d packages) into %s ...",
            server,
            len(wanted.packages),
            target,
        )
        _build(venv, wanted, target, gym_version, python_version, list(uv or find_uv()), env)
        seconds = time.monotonic() - began
        logger.info("installed requirements for %s in %.1f s", server, seconds)
    return ServerEnvironment(
        server=server, python=python, root=target, reused=False, seconds=seconds
    )


def environment_key(
    wanted: ServerRequirements, gym_version: str, python_version: str, interpreter: str
) -> str:
    """16 hex digits identifying a venv: the filtered requirements, the content of every
    file and local package they name, nemo-gym's version and the base interpreter."""
    digest = hashlib.sha256()
    facts = {
        "format": _FORMAT,
        "nemo_gym": gym_version,
        "python": python_version,
        "interpreter": interpreter,
        "lines": list(wanted.lines),
        "extras": sorted(wanted.nemo_gym_extras),
    }
    digest.update(json.dumps(facts, sort_keys=True).encode())
    files = [wanted.overrides] if wanted.overrides is not None else []
    files += [Path(line[3:]) for line in wanted.lines if line.startswith("-c ")]
    for path in files:
        digest.update(str(path).encode() + b"\0")
        digest.update(path.read_bytes() if path.is_file() else b"<missing>")
    for tree in wanted.local_paths:
        for chunk in _tree_chunks(tree):
            digest.update(chunk)
    return digest.hexdigest()[:16]


def nemo_gym_version(venv: GymVenv) -> str:
    """The installed nemo-gym version, read from its dist-info in the venv."""
    version = _metadata(venv, "nemo_gym", "Version")
    if version is None:
        raise ConfigError(f"no nemo_gym-*.dist-info with a Version in {venv.site_packages}")
    return version


def _python_version(venv: GymVenv) -> str:
    """``X.Y.Z`` of the venv's interpreter (from ``pyvenv.cfg``, else by running it)."""
    config = _pyvenv_cfg(venv)
    version = config.get("version_info") or config.get("version")
    if version:
        return ".".join(version.split(".")[:3])
    out = subprocess.run(
        [str(venv.python), "-c", "import platform; print(platform.python_version())"],
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.strip()


def _base_interpreter(venv: GymVenv) -> str:
    return _pyvenv_cfg(venv).get("home") or str(venv.python.resolve())


def _pyvenv_cfg(venv: GymVenv) -> dict[str, str]:
    path = venv.root / "pyvenv.cfg"
    if not path.is_file():
        return {}
    pairs = (line.partition("=") for line in path.read_text().splitlines())
    return {key.strip(): value.strip() for key, sep, value in pairs if sep}


def _requires_python_floor(venv: GymVenv) -> str | None:
    """The ``>=X.Y.Z`` floor of nemo-gym's ``Requires-Python``, if it declares one."""
    found = re.search(
        r">=\s*([0-9]+(\.[0-9]+)*)", _metadata(venv, "nemo_gym", "Requires-Python") or ""
    )
    return found.group(1) if found else None


def _metadata(venv: GymVenv, distribution: str, field: str) -> str | None:
    """A field of an installed distribution's ``METADATA`` in the venv (the first found)."""
    for metadata in sorted(venv.site_packages.glob(f"{distribution}-*.dist-info/METADATA")):
        for line in metadata.read_text(errors="replace").splitlines():
            if line.startswith(f"{field}:"):
                return line.partition(":")[2].strip()
    return None


def _is_ready(target: Path) -> bool:
    return (target / STAMP_NAME).is_file() and (target / "bin" / "python").exists()


def _build(
    venv: GymVenv,
    wanted: ServerRequirements,
    target: Path,
    gym_version: str,
    python_version: str,
    uv: list[str],
    env: Mapping[str, str] | None,
) -> None:
    """Build the venv at ``target`` from scratch; the stamp is written last."""
    if target.exists():
        logger.info("removing the incomplete venv %s", target)
        shutil.rmtree(target)
    lines = _staged_lines(wanted, target)
    pins = _pins(venv, wanted, gym_version)
    requirements_file = target.with_name(target.name + ".requirements.txt")
    requirements_file.write_text("\n".join([*pins, *lines]) + "\n")
    child_env = {k: v for k, v in (env if env is not None else os.environ).items()}
    for name in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", "CONDA_PREFIX"):
        child_env.pop(name, None)
    commands = [
        # --allow-existing: the local packages were copied into target/src already
        [*uv, "venv", "--quiet", "--allow-existing", "--python", str(venv.python), str(target)],
        [
            *uv,
            "pip",
            "install",
            "--python",
            str(target / "bin" / "python"),
            "--python-version",
            _resolve_as(venv, python_version),
            *(["--override", str(wanted.overrides)] if wanted.overrides else []),
            "-r",
            str(requirements_file),
        ],
    ]
    _run_logged(commands, wanted, target.with_name(target.name + ".log"), child_env)
    stamp = {
        "server": wanted.server,
        "source": str(wanted.source),
        "requirements": [*pins, *lines],
        "nemo_gym": gym_version,
        "python": python_version,
        "built_at": time.time(),
    }
    partial = target / (STAMP_NAME + ".tmp")
    partial.write_text(json.dumps(stamp, indent=1) + "\n")
    partial.replace(target / STAMP_NAME)


def _staged_lines(wanted: ServerRequirements, target: Path) -> list[str]:
    """The requirement lines, local packages installed from a copy inside the venv:
    building them in place would write into the NeMo Gym venv (egg-info, build/)."""
    lines = list(wanted.lines)
    for index, path in enumerate(wanted.local_paths):
        copy = target / "src" / f"{index}-{path.name}"
        shutil.copytree(path, copy, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        lines = [line.replace(str(path), str(copy), 1) for line in lines]
    return lines


def _pins(venv: GymVenv, wanted: ServerRequirements, gym_version: str) -> list[str]:
    """nemo-gym itself (with the extras the server asks for) and the parent's ``openai``
    and ``ray[default]``, as NeMo Gym's launcher pins them (``head_server_deps``)."""
    extras = f"[{','.join(wanted.nemo_gym_extras)}]" if wanted.nemo_gym_extras else ""
    pins = [f"nemo-gym{extras}=={gym_version}"]
    for name, requirement in (("openai", "openai"), ("ray", "ray[default]")):
        version = _metadata(venv, name, "Version")
        if version is not None:
            pins.append(f"{requirement}=={version}")
    return pins


def _resolve_as(venv: GymVenv, python_version: str) -> str:
    """The Python version uv resolves for: the interpreter's, raised to nemo-gym's
    ``Requires-Python`` floor (pip's ``--ignore-requires-python``, as its docs install it)."""
    floor = _requires_python_floor(venv)
    if floor is not None and _version_tuple(floor) > _version_tuple(python_version):
        return floor
    return python_version


def _run_logged(
    commands: list[list[str]],
    wanted: ServerRequirements,
    log_path: Path,
    env: Mapping[str, str],
) -> None:
    """Run each command, output to ``log_path``; ``RequirementsInstallError`` on failure."""
    with log_path.open("w") as log:
        for argv in commands:
            log.write(f"$ {' '.join(argv)}\n")
            log.flush()
            try:
                done = subprocess.run(
                    argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=dict(env)
                )
            except OSError as exc:
                log.write(f"{exc}\n")
                returncode: int | None = None
            else:
                returncode = done.returncode
            if returncode != 0:
                log.close()
                assert wanted.source is not None  # needs_environment implies a source
                raise RequirementsInstallError(
                    wanted.server, wanted.source, returncode, log_path, tail(log_path)
                )


def _version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", version)[:3])


def _tree_chunks(tree: Path) -> Iterator[bytes]:
    """What identifies a local package's content: its files' paths and bytes."""
    yield str(tree).encode() + b"\0"
    if not tree.is_dir():
        yield b"<missing>"
        return
    for path in sorted(tree.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
            yield str(path.relative_to(tree)).encode() + b"\0"
            yield path.read_bytes()


def _file_safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
