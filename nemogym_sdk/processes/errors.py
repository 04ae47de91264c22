"""Errors of a server process that the SDK starts (NeMo Gym's servers, vLLM, the router,
``nemogym_sdk.serve``); part of the one tree in :mod:`nemogym_sdk.errors`::

    NemoGymError
    └── ServerStartError(RuntimeError) a server process exited during start-up
    NotReadyError(TimeoutError)
    └── ServerNotReadyError            a server did not answer before the deadline

Both name the server and carry the tail of its log, so a failed start-up can be diagnosed
from the exception message alone. ``nemogym_sdk.gym`` re-exports them.
"""

from __future__ import annotations

from pathlib import Path

from nemogym_sdk.errors import NemoGymError, NotReadyError

__all__ = ["ServerNotReadyError", "ServerStartError"]


def _describe(server: str, what: str, log_path: Path | None, log_tail: str) -> str:
    where = f" (log: {log_path})" if log_path is not None else ""
    tail = log_tail.rstrip() or "<empty log>"
    return f"server {server!r} {what}{where}. Last lines of its log:\n{tail}"


class ServerStartError(NemoGymError, RuntimeError):
    """A server process exited before it became ready.

    ``server`` is its name (a NeMo Gym instance name, ``vllm`` ...), ``returncode`` the
    exit status, ``log_path`` the file holding the server's output and ``log_tail``
    its last lines.
    """

    def __init__(
        self, server: str, returncode: int | None, log_path: Path | None, log_tail: str
    ) -> None:
        what = f"exited with status {returncode} during start-up"
        super().__init__(_describe(server, what, log_path, log_tail))
        self.server = server
        self.returncode = returncode
        self.log_path = log_path
        self.log_tail = log_tail

    def __reduce__(self) -> tuple[type[ServerStartError], tuple[object, ...]]:
        return (type(self), (self.server, self.returncode, self.log_path, self.log_tail))


class ServerNotReadyError(NotReadyError):
    """A server was still not answering its health route when the deadline passed.

    ``server`` is its name, ``timeout`` the deadline in seconds, ``log_path``
    the server's log file and ``log_tail`` its last lines.
    """

    def __init__(self, server: str, timeout: float, log_path: Path | None, log_tail: str) -> None:
        what = f"did not become ready within {timeout:.1f} s"
        super().__init__(_describe(server, what, log_path, log_tail))
        self.server = server
        self.timeout = timeout
        self.log_path = log_path
        self.log_tail = log_tail

    def __reduce__(self) -> tuple[type[ServerNotReadyError], tuple[object, ...]]:
        return (type(self), (self.server, self.timeout, self.log_path, self.log_tail))
