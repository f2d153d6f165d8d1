"""Failure classification: from a failed job's log window to a verdict on retrying.

The pipeline calls :func:`load_classifier` once and then ``classifier.predict(windows)`` from a
worker thread; the online-learning loop fine-tunes with :func:`train_model` (``init_from=``) and
writes the result with :func:`save_checkpoint`. Importing this package does not import torch;
the heavy names load on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

from .api import ERROR_START, Classifier, LogWindow, Prediction, VerdictLabel, is_error_start

__all__ = [
    "ERROR_START",
    "Checkpoint",
    "Classifier",
    "Example",
    "LogWindow",
    "ModelClassifier",
    "ModelLoadError",
    "Prediction",
    "TrainConfig",
    "VerdictLabel",
    "is_error_start",
    "load_checkpoint",
    "load_classifier",
    "save_checkpoint",
    "train_model",
]

# name -> submodule; resolved lazily so that `sibylla --help` never pays for torch.
_LAZY = {
    "Checkpoint": "checkpoint",
    "ModelLoadError": "checkpoint",
    "load_checkpoint": "checkpoint",
    "save_checkpoint": "checkpoint",
    "ModelClassifier": "engine",
    "load_classifier": "engine",
    "Example": "train",
    "TrainConfig": "train",
    "train_model": "train",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
