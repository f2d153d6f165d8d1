"""Which model announcements a worker believes: signed by the trainer, newer than the last.

Checked before any file is touched (:func:`announce.verify` then checks where the file is and
its checksum):

- **signature**: with a public key configured (``SIBYLLA_MODEL_PUBLIC_KEY``), an announcement
  must carry the trainer's valid signature; without one, every announcement is refused unless
  ``SIBYLLA_ALLOW_UNSIGNED_MODELS`` is on. Refusing is the default because a worker that
  loads whatever the topic says is steered by anyone who can write the topic;
- **sequence**: an announcement older than the newest one this worker accepted is a replay
  (an old, validly signed announcement published again to bring back a model that was rolled
  back for a reason). The newest accepted sequence per model name is kept in a file in the
  worker's data directory, so a restarted worker, which reads the compacted topic from its
  start, still refuses it. The same sequence again is the same announcement and is accepted
  (a restarted worker loads the current model that way).
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from pathlib import Path

from sibylla.schemas.records import (
    ModelAnnouncement,
    RecordError,
    from_known_fields,
    load_json_object,
)

from .announce import AnnouncementError
from .settings import OnlineSettings
from .signing import load_public_key, signature_valid

__all__ = ["AnnouncementGuard", "SequenceFile"]

log = logging.getLogger(__name__)


class SequenceFile:
    """The newest accepted announcement sequence per model name, in a JSON file rewritten
    atomically (temp file, rename)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self._seen: dict[str, int] = json.loads(path.read_text())
        except FileNotFoundError:
            self._seen = {}

    def newest(self, name: str) -> int:
        return self._seen.get(name, -1)

    def accept(self, name: str, sequence: int) -> None:
        if sequence <= self.newest(name):
            return
        self._seen[name] = sequence
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, suffix=".tmp")
        with os.fdopen(fd, "w") as fh:
            json.dump(self._seen, fh)
        os.replace(tmp, self.path)


class AnnouncementGuard:
    """See module docstring. :meth:`admit` refuses with an :class:`AnnouncementError` whose
    ``reason`` labels the refusal metric; :meth:`accepted` records a model swapped in."""

    def __init__(self, settings: OnlineSettings, state_file: Path) -> None:
        self.public_key = (load_public_key(settings.model_public_key)
                           if settings.model_public_key else None)
        self.allow_unsigned = settings.allow_unsigned_models
        self.sequences = SequenceFile(state_file)
        if self.public_key is None:
            log.warning("no SIBYLLA_MODEL_PUBLIC_KEY: %s", "unsigned model announcements are "
                        "loaded (SIBYLLA_ALLOW_UNSIGNED_MODELS)" if self.allow_unsigned else
                        "every model announcement is refused")

    def admit(self, value: bytes) -> ModelAnnouncement:
        """The announcement in ``value`` if its signature and sequence check out."""
        try:
            raw = load_json_object(value)
            ann = from_known_fields(ModelAnnouncement, raw)
        except (RecordError, TypeError) as exc:
            raise AnnouncementError("unreadable", f"unreadable model announcement: {exc}"
                                    ) from None
        if self.public_key is not None:
            if not ann.signature:
                raise AnnouncementError("unsigned", f"model {ann.version}: unsigned "
                                        "announcement (a public key is configured)")
            if not signature_valid(self.public_key, raw):
                raise AnnouncementError("bad_signature", f"model {ann.version}: the signature "
                                        "is not the trainer's key's")
        elif not self.allow_unsigned:
            raise AnnouncementError("unsigned", f"model {ann.version}: no "
                                    "SIBYLLA_MODEL_PUBLIC_KEY to verify it with, and "
                                    "SIBYLLA_ALLOW_UNSIGNED_MODELS is off")
        if not isinstance(ann.sequence, int) or ann.sequence < self.sequences.newest(ann.name):
            raise AnnouncementError("replayed", f"model {ann.version}: sequence {ann.sequence} "
                                    f"is older than the newest accepted "
                                    f"({self.sequences.newest(ann.name)})")
        return ann

    def accepted(self, ann: ModelAnnouncement) -> None:
        self.sequences.accept(ann.name, ann.sequence)
