"""Server directories with extra data files, without touching the NeMo Gym venv.

Some shipped servers read data files next to their ``app.py`` that the wheel does not
ship (``wordle`` needs ``data/guesses.txt``, which its ``generate_data.py`` downloads).
Rather than writing into the venv's site-packages, :func:`make_overlay` builds a copy
of the server directory out of symlinks inside the stack's working directory, adds the
extra files there, and the server is started from that directory: its ``__file__``
then points into the overlay while every module it imports still comes from the venv.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path, PurePosixPath

from nemogym_sdk.errors import ConfigError

__all__ = ["FileSource", "make_overlay"]

FileSource = str | os.PathLike[str]
"""An overlay file: a ``str`` is the file's text, a path-like is a file to link to."""


def make_overlay(source_dir: Path, target_dir: Path, files: Mapping[str, FileSource]) -> Path:
    """Mirror ``source_dir`` into ``target_dir`` with symlinks and add ``files``.

    ``files`` maps paths relative to the server directory (``data/guesses.txt``) to a
    :data:`FileSource`. Directories on the way to an added file become real directories
    whose other entries are symlinks; everything else is a symlink to the original.
    Returns ``target_dir``.
    """
    if target_dir.exists():
        raise ConfigError(f"overlay directory {target_dir} already exists")
    relative = {_checked(path): source for path, source in files.items()}
    # Every directory that holds an added file must be real, not a symlink.
    real_dirs = {PurePosixPath(".")}
    for path in relative:
        real_dirs.update(path.parents)
    for directory in sorted(real_dirs, key=lambda p: len(p.parts)):
        original = source_dir / directory
        mirror = target_dir / directory
        mirror.mkdir(parents=True, exist_ok=True)
        if not original.is_dir():
            continue
        for entry in original.iterdir():
            entry_rel = directory / entry.name
            if entry_rel in real_dirs or entry_rel in relative or entry.name == "__pycache__":
                continue
            (mirror / entry.name).symlink_to(entry)
    for path, source in relative.items():
        destination = target_dir / path
        if isinstance(source, str):
            destination.write_text(source)
        else:
            destination.symlink_to(Path(source).resolve())
    return target_dir


def _checked(path: str) -> PurePosixPath:
    pure = PurePosixPath(path)
    if pure.is_absolute() or ".." in pure.parts or not pure.parts:
        raise ConfigError(f"overlay path {path!r} must be relative and stay inside the server dir")
    return pure
