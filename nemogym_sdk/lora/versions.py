"""Adapter versions on disk: ``<directory>/<adapter_name>/v000001``, written atomically.

``AdapterVersions`` is the part of ``LoraSync`` that owns the files: where version ``k``
lives, how it is written (into a temporary sibling, then renamed into place, so a server
never reads a half-written adapter), which served path is which version, and pruning the
old ones. It does no HTTP.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import tempfile
import uuid
from collections.abc import Callable, Collection
from pathlib import Path

from nemogym_sdk.errors import ConfigError

__all__ = ["AdapterVersions", "unwritable"]

logger = logging.getLogger(__name__)

_VERSION_DIR = re.compile(r"v(\d{6,})")


class AdapterVersions:
    """The version directories of one adapter under ``root`` (checked for writing)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        """``<directory>/<adapter_name>``."""
        problem = unwritable(root)
        if problem is not None:
            raise ConfigError(
                f"cannot write LoRA adapters under {root}: {problem}. Pass a directory= "
                "the trainer can write and the inference server can read."
            )

    def path(self, version: int) -> Path:
        """The directory of ``version``: ``<root>/v{version:06d}``."""
        return self.root / f"v{version:06d}"

    def version_of(self, served: str) -> int | None:
        """The version a served path (a ``/v1/models`` card's ``root``) is, or None when it
        is not one of these directories."""
        path = Path(served)
        match = _VERSION_DIR.fullmatch(path.name)
        if match is None or os.path.normpath(path.parent) != os.path.normpath(self.root):
            return None
        return int(match.group(1))

    def write(self, version: int, write: Callable[[Path], str]) -> Path:
        """Write ``version`` with ``write(tmp) -> the adapter's directory`` into a temporary
        sibling, then rename it into place (replacing a leftover); its final path."""
        final = self.path(version)
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
        try:
            written = Path(write(tmp))
            os.chmod(written, 0o755)  # mkdtemp makes 0700; the server may run as another user
            if final.exists():  # a leftover of an earlier run or a failed attempt
                aside = final.with_name(f".{final.name}.old-{uuid.uuid4().hex[:8]}")
                final.rename(aside)
                shutil.rmtree(aside, ignore_errors=True)
            written.rename(final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return final

    def prune(self, keep: Collection[Path]) -> None:
        """Delete every version directory except those in ``keep``."""
        kept = {path.name for path in keep}
        for entry in self.root.iterdir():
            if _VERSION_DIR.fullmatch(entry.name) and entry.name not in kept and entry.is_dir():
                shutil.rmtree(entry, ignore_errors=True)
                logger.debug("pruned %s", entry)


def unwritable(path: Path) -> str | None:
    """Why the directory ``path`` cannot be created or take a file (the OS's reason), or
    None when it can (it exists afterwards)."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        handle, check = tempfile.mkstemp(prefix=".write-check-", dir=path)
        os.close(handle)
        os.unlink(check)
    except OSError as exc:
        return str(exc.strerror or exc)
    return None
