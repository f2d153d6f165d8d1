"""Saving and loading models: one safetensors file, weights plus versioned metadata.

The file's metadata header carries everything needed to rebuild the model exactly: the format
version, the model config, the vocabulary and the training metadata (version string, data hash,
metrics, calibrated temperature and threshold). One file swaps atomically (the online-learning
announcements ship one path), and safetensors never executes code from the file. Anything wrong
with a file raises one :class:`ModelLoadError` that says what and where.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from .model import ModelConfig, RecurrentClassifier
from .vocab import Vocabulary

__all__ = [
    "FORMAT",
    "Checkpoint",
    "ModelLoadError",
    "load_checkpoint",
    "save_checkpoint",
    "shipped_model_path",
]

logger = logging.getLogger(__name__)

FORMAT = "sibylla-classifier/2"  # 2: the line-level model with its wide path
SHIPPED_NAME = "classifier.safetensors"


class ModelLoadError(RuntimeError):
    """A model file is missing, corrupt, of another format, or does not match its config."""


@dataclass
class Checkpoint:
    """A loaded model with its vocabulary and metadata."""

    model: RecurrentClassifier
    vocab: Vocabulary
    meta: dict[str, Any] = field(default_factory=dict)


def shipped_model_path() -> Path:
    """The model shipped in the package."""
    return Path(str(resources.files("sibylla.inference") / "model" / SHIPPED_NAME))


def save_checkpoint(model: RecurrentClassifier, vocab: Vocabulary, meta: dict[str, Any],
                    path: str | Path) -> Path:
    """Write ``model`` to ``path`` atomically (temp file, then rename); returns the path."""
    from safetensors.torch import save_file

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    header = {
        "format": FORMAT,
        "config": json.dumps(model.config.to_dict()),
        "vocab": json.dumps(vocab.tokens),
        "meta": json.dumps(meta, sort_keys=True),
    }
    tensors = {k: v.detach().float().cpu().contiguous() for k, v in model.state_dict().items()}
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    os.close(fd)
    try:
        save_file(tensors, tmp, metadata=header)
        os.chmod(tmp, 0o644)  # mkstemp's 0600 would hide a shipped model from other users
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    logger.info("saved model %s to %s", meta.get("version", "?"), path)
    return path


def load_checkpoint(path: str | Path | None = None) -> Checkpoint:
    """Load a checkpoint (the shipped one when ``path`` is empty); see :class:`ModelLoadError`."""
    from safetensors import SafetensorError, safe_open

    path = Path(path) if path else shipped_model_path()
    if path.is_dir():
        path = path / SHIPPED_NAME
    if not path.is_file():
        raise ModelLoadError(f"model file not found: {path}")
    try:
        with safe_open(str(path), framework="pt") as fh:
            header = fh.metadata() or {}
            tensors = {k: fh.get_tensor(k) for k in fh.keys()}
    except (SafetensorError, OSError, ValueError) as exc:
        raise ModelLoadError(f"{path}: not a readable safetensors file ({exc})") from None
    if header.get("format") != FORMAT:
        raise ModelLoadError(f"{path}: format {header.get('format')!r}, expected {FORMAT!r}")
    try:
        config = ModelConfig.from_dict(json.loads(header["config"]))
        vocab = Vocabulary(json.loads(header["vocab"]))
        meta = json.loads(header["meta"])
        if len(vocab) != config.vocab_size:
            raise ValueError(f"vocabulary has {len(vocab)} tokens, config says "
                             f"{config.vocab_size}")
        model = RecurrentClassifier(config)
        model.load_state_dict(tensors, strict=True)
    except (KeyError, TypeError, ValueError, RuntimeError) as exc:
        raise ModelLoadError(f"{path}: checkpoint does not match its config ({exc})") from None
    model.eval()
    return Checkpoint(model, vocab, meta)
