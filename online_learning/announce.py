"""Model announcements on ``sibylla.models``: making one, and checking one before loading it.

A worker must never load a file that is not the one the trainer promoted (a half-copied file
on a shared volume, a stale cache, a tampered artifact), so every announcement carries the
file's SHA-256 and :func:`verify` refuses a mismatch before the model is read.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from sibylla.schemas.records import ModelAnnouncement

__all__ = ["AnnouncementError", "announcement", "model_path", "sha256_file", "verify"]

CHUNK = 1 << 20


class AnnouncementError(RuntimeError):
    """An announced model cannot be used: missing file, unknown scheme or wrong checksum."""


def sha256_file(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


def model_path(uri: str) -> Path:
    """The local path of a ``file://`` URI or a plain path (the only sources supported)."""
    parsed = urlparse(uri)
    if parsed.scheme == "file":
        return Path(unquote(parsed.path))
    if parsed.scheme == "":
        return Path(uri)
    raise AnnouncementError(f"model URI scheme {parsed.scheme!r} not supported: {uri}")


def announcement(name: str, version: str, path: Path, sha256: str, metrics: dict[str, Any]
                 ) -> ModelAnnouncement:
    """The announcement of the model file at ``path`` with the checksum recorded when it was
    written (not hashed again now: a file damaged since would be announced as it is)."""
    return ModelAnnouncement(name, version, sha256, path.resolve().as_uri(), metrics)


def verify(ann: ModelAnnouncement) -> Path:
    """The announced file's path once its checksum matches; :class:`AnnouncementError` else."""
    path = model_path(ann.uri)
    if not path.is_file():
        raise AnnouncementError(f"model {ann.version}: file not found: {path}")
    actual = sha256_file(path)
    if actual != ann.sha256:
        raise AnnouncementError(f"model {ann.version}: checksum {actual} does not match the "
                                f"announced {ann.sha256}")
    return path
