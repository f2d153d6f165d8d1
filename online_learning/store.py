"""The trainer's model registry: a directory of model files plus an index of every candidate.

``<models_dir>/<version>.safetensors`` for each promoted model (workers load it from there, so
the directory is a volume they share), and ``index.json``: every candidate with its scores and
whether it was promoted, plus which version is current. The index is rewritten atomically
(temp file, rename), so a crash never leaves half an index; ``sibylla models list|rollback``
read and change it, the operator's process beside the trainer's, so every change re-reads the
index first. The index also keeps the sequence number of the last announcement.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from sibylla.inference.checkpoint import Checkpoint, load_checkpoint, save_checkpoint

from .announce import sha256_file

__all__ = ["ModelEntry", "ModelStore"]

INDEX = "index.json"
INDEX_VERSION = 1


@dataclass
class ModelEntry:
    """One candidate: its scores and, when promoted, its file and checksum."""

    version: str
    status: str  # "promoted", "rejected" or "base"
    scores: dict[str, Any] = field(default_factory=dict)
    reasons: list[str] = field(default_factory=list)
    file: str = ""
    sha256: str = ""
    parent: str | None = None
    trained_until: float = 0.0  # labeled_at of the newest label it was trained on
    created_at: float = field(default_factory=time.time)


class ModelStore:
    """See module docstring. One trainer writes it; an operator may roll back meanwhile."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    def _read(self) -> dict[str, Any]:
        path = self.root / INDEX
        if not path.is_file():
            return {"v": INDEX_VERSION, "current": None, "models": []}
        index: dict[str, Any] = json.loads(path.read_text())
        if index.get("v") != INDEX_VERSION:
            raise ValueError(f"{path}: index version {index.get('v')!r}, expected "
                             f"{INDEX_VERSION}")
        return index

    def _write(self, index: dict[str, Any]) -> None:
        fd, tmp = tempfile.mkstemp(dir=self.root, suffix=".tmp")
        with os.fdopen(fd, "w") as fh:
            json.dump(index, fh, indent=1, sort_keys=True)
        os.replace(tmp, self.root / INDEX)

    def entries(self) -> list[ModelEntry]:
        return [ModelEntry(**raw) for raw in self._read()["models"]]

    def get(self, version: str) -> ModelEntry:
        return _stored(self._read(), version)

    @property
    def current(self) -> ModelEntry | None:
        index = self._read()
        return _stored(index, index["current"]) if index["current"] else None

    def path(self, entry: ModelEntry) -> Path:
        return self.root / entry.file

    def load(self, entry: ModelEntry) -> Checkpoint:
        return load_checkpoint(self.path(entry))

    def record(self, entry: ModelEntry, checkpoint: Checkpoint | None = None) -> ModelEntry:
        """Add ``entry``; with ``checkpoint``, also write its file (promoted or base models)."""
        if checkpoint is not None:
            entry.file = f"{entry.version}.safetensors"
            save_checkpoint(checkpoint.model, checkpoint.vocab, checkpoint.meta,
                            self.path(entry))
            entry.sha256 = sha256_file(self.path(entry))
        index = self._read()
        index["models"].append(asdict(entry))
        self._write(index)
        return entry

    def next_sequence(self) -> int:
        """The sequence number of the next announcement: above every one handed out before,
        and at least the time in milliseconds, so that a models directory lost and made anew
        still announces above what workers last accepted (``trust.py``)."""
        index = self._read()
        sequence = max(int(index.get("sequence", 0)) + 1, time.time_ns() // 1_000_000)
        index["sequence"] = sequence
        self._write(index)
        return sequence

    def set_current(self, version: str) -> ModelEntry:
        """Make a stored model the current one (promotion, or an operator's rollback)."""
        index = self._read()
        entry = _stored(index, version)
        index["current"] = version
        self._write(index)
        return entry


def _stored(index: dict[str, Any], version: str) -> ModelEntry:
    """The entry of a stored (promoted or base) model in one read of the index."""
    for raw in index["models"]:
        if raw["version"] == version and raw["file"]:
            return ModelEntry(**raw)
    raise KeyError(f"no stored model {version!r}")
