"""Cross-validation of the training recipe by repository: every real log decided by a model that
never saw its project.

The held-out files give the shipped model's headline, but they hold a few hundred logs, and one
log moves its deterministic precision by half a point. Cross-validation reads every packaged
real log instead: the logs are split into folds by repository, and for each fold a model is
trained with the shipped recipe on the generated logs plus the other folds' real logs, the TF-IDF
baselines on the same records; each log is decided by the classifiers of its own fold. The
pooled predictions are scored as ``sibylla evaluate`` scores a file, the model's operating point
cross-fitted by project (a fold's model has no operating threshold of its own: the shipped one
is chosen on held-out real logs). What this measures is the recipe, not the shipped weights.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from .api import Prediction
from .corpus import Record, project_of
from .engine import ModelClassifier
from .evaluate import classifier_predictions, report_from_predictions
from .preprocess import window_from_text
from .synthetic import generate
from .train import TrainConfig, examples_from_records, train_model

__all__ = ["cross_validate", "project_fold", "repository_folds"]

logger = logging.getLogger(__name__)


def project_fold(record: Record, folds: int) -> int:
    """The fold of ``record``'s repository: stable across runs, files and record order."""
    digest = hashlib.sha256(project_of(record).encode()).digest()
    return int.from_bytes(digest[:8], "big") % folds


def repository_folds(records: Sequence[Record], folds: int
                     ) -> list[tuple[list[int], list[Record]]]:
    """Per fold (empty ones included): the indices of its records and the other folds'
    records, which a model deciding the fold may train on."""
    fold_of = [project_fold(r, folds) for r in records]
    return [([i for i, f in enumerate(fold_of) if f == k],
             [r for r, f in zip(records, fold_of, strict=True) if f != k])
            for k in range(folds)]


def cross_validate(config: TrainConfig, records: Sequence[Record], folds: int = 5
                   ) -> dict[str, Any]:
    """``records`` (real logs) decided fold by fold by models trained with ``config`` on the
    generated logs plus the other folds' records; the pooled report, with each fold's size."""
    if folds < 2:
        raise ValueError(f"cross-validation needs at least 2 folds, got {folds}")
    synthetic = generate(config.synthetic, seed=config.seed)
    windows = [window_from_text(r.log, job_id=r.id) for r in records]
    pooled: dict[str, dict[int, Prediction]] = {}  # row -> record index -> its decision
    splits = repository_folds(records, folds)
    for k, (test, others) in enumerate(splits):
        if not test:
            continue
        train = synthetic + others
        logger.info("fold %d/%d: %d held out, %d training logs", k + 1, folds, len(test),
                    len(train))
        checkpoint = train_model(examples_from_records(train), replace(config, real_files=()))
        fold = classifier_predictions(ModelClassifier(checkpoint, device="cpu"),
                                      [records[i] for i in test], train,
                                      [windows[i] for i in test])
        del fold["model"]  # a fold's own threshold is its validation split's, not an operating one
        for name, predictions in fold.items():
            pooled.setdefault(name, {}).update(zip(test, predictions, strict=True))
    # every record is in exactly one fold, so each row holds a decision for every index
    ordered = {name: [by_index[i] for i in range(len(records))]
               for name, by_index in pooled.items()}
    report = report_from_predictions(records, windows, ordered)
    return {**report, "folds": folds, "fold_sizes": [len(test) for test, _ in splits],
            "train_config": config.to_dict()}
