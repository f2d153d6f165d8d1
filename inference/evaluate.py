"""Scoring the model and every baseline on a corpus file, on the same records.

The baselines that learn (TF-IDF) are trained on exactly the records the model was trained on,
rebuilt from the training config in the model's metadata, so that every row of the table has
seen the same data. Records whose source was in the training data are reported, never hidden:
a score on them is not a held-out score.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from .api import Classifier, LogWindow
from .baselines import ConstantVerdict, RegexRules, TfidfLogReg
from .corpus import Record
from .engine import ModelClassifier
from .metrics import score
from .preprocess import window_from_text
from .train import TrainConfig, default_training_records

__all__ = ["evaluate_classifier", "evaluate_file", "format_table"]

logger = logging.getLogger(__name__)

TABLE_KEYS = ("accuracy", "macro_f1", "deterministic_precision", "deterministic_recall",
              "nondeterministic_recall", "abstention_rate")


def evaluate_classifier(classifier: Classifier, records: Sequence[Record], batch: int = 64,
                        windows: Sequence[LogWindow] | None = None) -> dict[str, Any]:
    """Metrics of ``classifier`` on ``records`` (see :func:`.metrics.score`); ``windows``:
    the records' windows when already built (several classifiers on the same records)."""
    if windows is None:
        windows = [window_from_text(r.log, job_id=r.id) for r in records]
    predictions = []
    for start in range(0, len(windows), batch):
        predictions += classifier.predict(windows[start : start + batch])
    return score([r.label for r in records], [p.verdict for p in predictions],
                 [r.category for r in records], [p.category for p in predictions])


def evaluate_file(model: ModelClassifier, records: Sequence[Record],
                  train_records: Sequence[Record] | None = None) -> dict[str, Any]:
    """The model (at its threshold and without abstention) and every baseline on ``records``.

    ``train_records`` defaults to the model's own training data, rebuilt from its metadata.
    """
    if train_records is None:
        train_records = default_training_records(TrainConfig.from_meta(model.meta))
    train_sources = {r.source for r in train_records}
    overlap = sum(r.source in train_sources for r in records)
    if overlap:
        logger.warning("%d of %d records come from sources in the training data: "
                       "their scores are not held-out scores", overlap, len(records))
    tfidf = TfidfLogReg().fit([window_from_text(r.log) for r in train_records],
                              [r.category for r in train_records])
    classifiers: dict[str, Classifier] = {
        "model": model,
        "model, no abstention": model.with_threshold(0.0),
        "regex rules": RegexRules(),
        "tf-idf + logistic regression": tfidf,
        "always retry": ConstantVerdict("nondeterministic"),
        "never retry": ConstantVerdict("deterministic"),
    }
    windows = [window_from_text(r.log, job_id=r.id) for r in records]
    rows = {name: evaluate_classifier(c, records, windows=windows)
            for name, c in classifiers.items()}
    headline = rows["model"]
    return {**{k: headline[k] for k in TABLE_KEYS}, "model_version": model.version,
            "threshold": model.threshold, "n": len(records), "overlap_with_training": overlap,
            "model": headline, "rows": rows}


def format_table(report: dict[str, Any]) -> str:
    """The comparison table as Markdown."""
    header = "| classifier | " + " | ".join(TABLE_KEYS) + " |"
    lines = [header, "|" + "---|" * (len(TABLE_KEYS) + 1)]
    for name, row in report["rows"].items():
        lines.append(f"| {name} | " + " | ".join(f"{row[k]:.3f}" for k in TABLE_KEYS) + " |")
    return "\n".join(lines)
