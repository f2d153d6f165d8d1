"""Scoring a model on a validation set, and the promotion gate.

A candidate replaces the current model only if, on examples it never trained on, it is not
worse beyond a tolerance on every part of the validation set (the real logs and the held-back
recent labels: improving on the new failures must not cost the old ones), and its
``deterministic`` precision does not drop: a wrong ``do_not_retry`` kills a job that would have
succeeded, so that number may never get worse for the sake of accuracy.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from sibylla.inference.api import Classifier
from sibylla.inference.preprocess import window_from_text
from sibylla.inference.taxonomy import CATEGORIES, label_of
from sibylla.inference.train import Example

__all__ = ["GateResult", "Scores", "gate", "score"]


@dataclass(frozen=True)
class Scores:
    """How a model does on one set of labeled logs.

    ``accuracy``: the class the model leans to (ignoring its confidence threshold) is right;
    ``det_precision``: of the confident ``deterministic`` verdicts (those that stop a job), the
    share truly deterministic (1.0 when it gave none; ``det_decided`` says how many it gave);
    ``coverage``: share of confident verdicts (not ``unknown``).
    """

    n: int
    accuracy: float
    det_precision: float
    det_decided: int
    coverage: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def score(classifier: Classifier, examples: Sequence[Example], batch: int = 64) -> Scores:
    if not examples:
        return Scores(0, 1.0, 1.0, 0, 0.0)
    right = decided = det = det_right = 0
    for start in range(0, len(examples), batch):
        part = examples[start : start + batch]
        windows = [window_from_text(ex.log) for ex in part]
        for ex, p in zip(part, classifier.predict(windows), strict=True):
            leaned = p.verdict if p.verdict != "unknown" else (
                label_of(p.category) if p.category in CATEGORIES else "")
            right += leaned == ex.label
            decided += p.verdict != "unknown"
            if p.verdict == "deterministic":
                det += 1
                det_right += ex.label == "deterministic"
    n = len(examples)
    return Scores(n, round(right / n, 4), round(det_right / det, 4) if det else 1.0, det,
                  round(decided / n, 4))


@dataclass(frozen=True)
class GateResult:
    promote: bool
    reasons: list[str]  # why not (empty when promoted)


def gate(current: Mapping[str, Scores], candidate: Mapping[str, Scores], tolerance: float,
         precision_tolerance: float) -> GateResult:
    """Compare the two models part by part (same keys, e.g. ``real`` and ``recent``)."""
    reasons = []
    for part, cur in current.items():
        cand = candidate[part]
        if cand.n and cand.accuracy < cur.accuracy - tolerance:
            reasons.append(f"{part}: accuracy {cand.accuracy:.4f} < {cur.accuracy:.4f} - "
                           f"{tolerance}")
        if cand.n and cand.det_precision < cur.det_precision - precision_tolerance:
            reasons.append(f"{part}: deterministic precision {cand.det_precision:.4f} < "
                           f"{cur.det_precision:.4f} - {precision_tolerance}")
    return GateResult(not reasons, reasons)
