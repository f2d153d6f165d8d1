"""The actuator's audit file: one JSON line per decision, that survives log rotation.

logrotate's default (``create``) renames the file and lets the writer go on: a writer that
keeps its descriptor then appends to the rotated file, which is compressed and deleted later,
and the audit lines written after the rotation are lost with it. Like the standard library's
``logging.handlers.WatchedFileHandler``, :class:`AuditFile` checks before each line that its
path still names the file it has open, and opens the path again when it does not.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import BinaryIO, Protocol

__all__ = ["AuditFile", "AuditSink"]


class AuditSink(Protocol):
    """Where audit lines go: an :class:`AuditFile`, standard output, a buffer in tests."""

    def write(self, line: bytes, /) -> int: ...

    def flush(self) -> None: ...


class AuditFile:
    """Append-only lines to ``path``, reopened after the file was moved or removed."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file, self._identity = self._open()

    def _open(self) -> tuple[BinaryIO, tuple[int, int]]:
        file = open(self.path, "ab")  # noqa: SIM115 - kept open between lines
        status = os.fstat(file.fileno())
        return file, (status.st_dev, status.st_ino)

    def _rotated(self) -> bool:
        try:
            status = os.stat(self.path)
        except FileNotFoundError:
            return True
        return (status.st_dev, status.st_ino) != self._identity

    def write(self, line: bytes) -> int:
        """Append ``line`` (with its newline) to the file the path names now."""
        if self._rotated():
            self._file.close()
            self._file, self._identity = self._open()
        return self._file.write(line)

    def flush(self) -> None:
        self._file.flush()

    def close(self) -> None:
        self._file.close()
