"""Per-server requirements: what a NeMo Gym server needs beyond the NeMo Gym venv.

NeMo Gym's launcher gives every server a venv of its own, built with ``uv`` from the
server directory's ``requirements.txt`` (or the ``[project] dependencies`` of its
``pyproject.toml``), with ``overrides.txt`` as uv overrides when present, the line that
points back at nemo-gym itself replaced by ``nemo-gym==<the installed version>``.
:func:`read_server_requirements` reads and filters them (pure): the nemo-gym
self-reference ``-e nemo-gym[dev] @ ../../``, ``-e ../../`` or a bare ``nemo-gym`` is
dropped, its extras other than ``dev`` kept; comments and blank lines go; ``-r`` includes
are inlined; relative paths become absolute. :mod:`nemogym_sdk.gym.server_envs` builds the
venvs from what it returns.
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Iterator
from pathlib import Path

import attrs

from nemogym_sdk.errors import ConfigError

__all__ = ["ServerRequirements", "read_server_requirements"]

_SELF_NAME = re.compile(r"^nemo[-_.]gym\s*(\[([^\]]*)\])?\s*(@.*|[<>=!~;].*)?$", re.IGNORECASE)
_PATH_EXTRAS = re.compile(r"^(?P<path>.*?)(\[(?P<extras>[^\]]*)\])?$")
_INCLUDE = re.compile(r"^(-r|--requirement)(\s+|=)(?P<file>.+)$")
_CONSTRAINT = re.compile(r"^(-c|--constraint)(\s+|=)(?P<file>.+)$")
_EDITABLE = re.compile(r"^(-e|--editable)(\s+|=)(?P<target>.+)$")
_SKIPPED_EXTRAS = frozenset({"dev"})  # nemo-gym's test tooling, not needed to run a server


@attrs.frozen(kw_only=True)
class ServerRequirements:
    """What a server directory needs beyond the NeMo Gym venv, filtered and resolved."""

    server: str
    """``<server_type>/<impl>``, e.g. ``resources_servers/math_with_judge``."""
    source: Path | None
    """The ``requirements.txt`` or ``pyproject.toml`` read; ``None`` when there is neither."""
    lines: tuple[str, ...]
    """Requirement lines to install: packages, with pip options (``--extra-index-url``,
    ``-c <absolute path>``, ``-e <absolute path>``) kept in place."""
    packages: tuple[str, ...]
    """The lines of :attr:`lines` that name something to install (not options)."""
    nemo_gym_extras: tuple[str, ...]
    """Extras of the nemo-gym self-reference (e.g. ``sandbox``), ``dev`` left out."""
    overrides: Path | None
    """``overrides.txt`` of the server directory, passed to uv as ``--override``."""
    local_paths: tuple[Path, ...]
    """Local directories the lines install from (copied into the venv before install)."""

    @property
    def needs_environment(self) -> bool:
        """Whether the server needs a venv of its own (anything beyond plain nemo-gym)."""
        return bool(self.packages or self.nemo_gym_extras)


def read_server_requirements(server_dir: Path, server: str | None = None) -> ServerRequirements:
    """Read a server directory's ``requirements.txt`` (or ``pyproject.toml``) and filter it.

    ``server`` names it in messages (default: the last two parts of ``server_dir``).
    Raises :class:`~nemogym_sdk.errors.ConfigError` when the directory has both files (as
    NeMo Gym does) or a file cannot be read.
    """
    server_dir = Path(server_dir)
    server = server or "/".join(server_dir.parts[-2:])
    requirements_txt = server_dir / "requirements.txt"
    pyproject = server_dir / "pyproject.toml"
    overrides = server_dir / "overrides.txt"
    if requirements_txt.is_file() and pyproject.is_file():
        raise ConfigError(
            f"{server}: both {requirements_txt.name} and {pyproject.name} in {server_dir}; "
            "a server directory must use one or the other"
        )
    if requirements_txt.is_file():
        source: Path | None = requirements_txt
        raw = list(_logical_lines(requirements_txt, seen=()))
    elif pyproject.is_file():
        source = pyproject
        raw = [(line, server_dir) for line in _pyproject_dependencies(pyproject)]
    else:
        source, raw = None, []
    lines: list[str] = []
    packages: list[str] = []
    extras: list[str] = []
    local: list[Path] = []
    for line, base in raw:
        kept, is_package, self_extras, path = _filter_line(line, base)
        extras += [e for e in self_extras if e not in extras]
        if kept is None:
            continue
        lines.append(kept)
        if is_package:
            packages.append(kept)
        if path is not None:
            local.append(path)
    return ServerRequirements(
        server=server,
        source=source,
        lines=tuple(lines),
        packages=tuple(packages),
        nemo_gym_extras=tuple(e for e in extras if e not in _SKIPPED_EXTRAS),
        overrides=overrides.resolve() if overrides.is_file() and packages else None,
        local_paths=tuple(local),
    )


def _logical_lines(path: Path, seen: tuple[Path, ...]) -> Iterator[tuple[str, Path]]:
    """Non-blank, comment-free lines of a requirements file, ``-r`` includes inlined,
    each with the directory its relative paths resolve against."""
    resolved = path.resolve()
    if resolved in seen:
        raise ConfigError(f"requirements include cycle: {' -> '.join(map(str, [*seen, path]))}")
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read requirements file {path}: {exc}") from exc
    pending = ""
    for physical in text.splitlines():
        if physical.endswith("\\"):
            pending += physical[:-1]
            continue
        line = _strip_comment(pending + physical)
        pending = ""
        if not line:
            continue
        include = _INCLUDE.match(line)
        if include:
            yield from _logical_lines(path.parent / include["file"].strip(), (*seen, resolved))
            continue
        yield line, path.parent
    if _strip_comment(pending):
        yield _strip_comment(pending), path.parent


def _strip_comment(line: str) -> str:
    """pip's rule: ``#`` at the start or after whitespace starts a comment (URLs keep theirs)."""
    return re.sub(r"(^|\s)#.*$", "", line).strip()


def _pyproject_dependencies(path: Path) -> list[str]:
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from exc
    dependencies = data.get("project", {}).get("dependencies", [])
    if not isinstance(dependencies, list):
        raise ConfigError(f"{path}: [project] dependencies must be a list")
    return [str(d).strip() for d in dependencies if str(d).strip()]


def _filter_line(line: str, base: Path) -> tuple[str | None, bool, list[str], Path | None]:
    """``(line to keep or None, is a package, nemo-gym extras, local path)`` for one line."""
    constraint = _CONSTRAINT.match(line)
    if constraint:
        return f"-c {(base / constraint['file'].strip()).resolve()}", False, [], None
    editable = _EDITABLE.match(line)
    target = editable["target"].strip() if editable else line
    named = _SELF_NAME.match(target)
    if named:  # nemo-gym itself, however spelled: the installed version is pinned instead
        return None, False, _split_extras(named.group(2)), None
    if target.startswith((".", "/", "file:")):
        spec = _PATH_EXTRAS.match(target.removeprefix("file://").removeprefix("file:"))
        assert spec is not None  # the pattern matches any string
        relative = spec["path"].strip()
        if os.path.normpath(relative) == os.path.normpath("../.."):
            # The server's checkout root, i.e. nemo-gym itself (``-e ../../``).
            return None, False, _split_extras(spec["extras"]), None
        path = (base / relative).resolve()
        extras = f"[{spec['extras']}]" if spec["extras"] else ""
        prefix = "-e " if editable else ""
        return f"{prefix}{path}{extras}", True, [], path
    if line.startswith("-"):
        return line, False, [], None  # an option (--extra-index-url ...): kept as written
    return line, True, [], None


def _split_extras(extras: str | None) -> list[str]:
    return [e.strip() for e in (extras or "").split(",") if e.strip()]
