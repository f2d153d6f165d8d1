"""Model announcements on ``sibylla.models``: making one, and checking one before loading it.

A worker must never load a file that is not the one the trainer promoted (a half-copied file
on a shared volume, a stale cache, a tampered artifact, a file outside the models volume), so
every announcement carries the file's SHA-256 and :func:`verify` refuses a mismatch, or a
path outside the configured roots, before the model is read. Who may announce at all is the
signature's business (``signing.py``, checked by ``trust.py``).
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import orjson
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from sibylla.schemas.records import ModelAnnouncement

from .signing import sign

__all__ = ["AnnouncementError", "announcement", "model_path", "sha256_file", "verify"]

CHUNK = 1 << 20


class AnnouncementError(RuntimeError):
    """An announcement a worker refuses; ``reason`` is the metric label (``unsigned``,
    ``bad_signature``, ``replayed``, ``outside_roots``, ``checksum``, ...)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


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
    raise AnnouncementError("bad_uri", f"model URI scheme {parsed.scheme!r} not supported: "
                                       f"{uri}")


def announcement(name: str, version: str, path: Path, sha256: str, metrics: dict[str, Any],
                 sequence: int, key: Ed25519PrivateKey | None) -> ModelAnnouncement:
    """The announcement of the model file at ``path`` with the checksum recorded when it was
    written (not hashed again now: a file damaged since would be announced as it is), signed
    with ``key`` (unsigned when None)."""
    ann = ModelAnnouncement(name, version, sha256, path.resolve().as_uri(), metrics,
                            sequence=sequence)
    if key is None:
        return ann
    return dataclasses.replace(ann, signature=sign(key, orjson.loads(ann.to_json())))


def verify(ann: ModelAnnouncement, roots: Sequence[Path]) -> Path:
    """The announced file's path once it lies in one of ``roots`` (resolved: symlinks and
    ``..`` cannot lead out) and its checksum matches; :class:`AnnouncementError` else."""
    path = model_path(ann.uri).resolve()
    if not any(path.is_relative_to(root) for root in roots):
        raise AnnouncementError("outside_roots", f"model {ann.version}: {path} is outside the "
                                f"model roots ({', '.join(map(str, roots))})")
    if not path.is_file():
        raise AnnouncementError("missing_file", f"model {ann.version}: file not found: {path}")
    try:
        actual = sha256_file(path)
    except OSError as exc:
        raise AnnouncementError("missing_file", f"model {ann.version}: cannot read {path}: "
                                f"{exc.strerror}") from None
    if actual != ann.sha256:
        raise AnnouncementError("checksum", f"model {ann.version}: checksum {actual} does not "
                                f"match the announced {ann.sha256}")
    return path
