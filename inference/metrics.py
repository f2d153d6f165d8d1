"""Scores of verdict predictions against labels, with abstention counted honestly.

An ``unknown`` verdict is never right: it lowers accuracy and recall (the job falls back to
the scheduler's default policy) but not precision. ``macro_f1`` therefore rewards a model only
for the verdicts it commits to; ``decided_accuracy`` is the accuracy on those alone.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np

from .taxonomy import LABELS

__all__ = ["score", "wilson_bounds", "wilson_interval"]


def _ratio(num: int, den: int) -> float:
    return round(num / den, 4) if den else 0.0


def wilson_bounds(successes: np.ndarray, n: np.ndarray, z: float = 1.96
                  ) -> tuple[np.ndarray, np.ndarray]:
    """Element-wise Wilson score interval of proportions (95 % by default); (0, 1) where ``n``
    is 0. Unlike the normal approximation it stays inside [0, 1] and is honest at the
    extremes: 46 right out of 46 gives a lower bound of 0.923, not 1."""
    n_safe = np.maximum(n, 1)
    p = successes / n_safe
    centre = p + z * z / (2 * n_safe)
    margin = z * np.sqrt(p * (1 - p) / n_safe + z * z / (4 * n_safe * n_safe))
    den = 1 + z * z / n_safe
    return (np.where(n > 0, np.maximum(0.0, (centre - margin) / den), 0.0),
            np.where(n > 0, np.minimum(1.0, (centre + margin) / den), 1.0))


def wilson_interval(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """:func:`wilson_bounds` of one proportion, rounded to four places."""
    lo, hi = wilson_bounds(np.array(successes), np.array(n), z)
    return round(float(lo), 4), round(float(hi), 4)


def score(labels: Sequence[str], verdicts: Sequence[str], categories: Sequence[str],
          predicted_categories: Sequence[str]) -> dict[str, Any]:
    """Accuracy, macro-F1, per-class precision/recall, abstention, confusion, per category."""
    n = len(labels)
    pairs = list(zip(labels, verdicts, strict=True))
    per_class = {}
    for cls in LABELS:
        tp = sum(y == cls and p == cls for y, p in pairs)
        predicted = sum(p == cls for _, p in pairs)
        actual = sum(y == cls for y, _ in pairs)
        precision, recall = _ratio(tp, predicted), _ratio(tp, actual)
        f1 = round(2 * precision * recall / (precision + recall), 4) if precision + recall else 0.0
        per_class[cls] = {"precision": precision, "recall": recall, "f1": f1, "support": actual}
    decided = [(y, p) for y, p in pairs if p != "unknown"]
    confusion: dict[str, dict[str, int]] = {
        y: dict(Counter(p for yy, p in pairs if yy == y)) for y in LABELS
    }
    det_tp = sum(y == p == LABELS[0] for y, p in pairs)
    det_decided = sum(p == LABELS[0] for _, p in pairs)
    per_category: dict[str, dict[str, float]] = {}
    for cat in sorted(set(categories)):
        rows = [i for i, c in enumerate(categories) if c == cat]
        per_category[cat] = {
            "n": len(rows),
            "verdict_accuracy": _ratio(sum(labels[i] == verdicts[i] for i in rows), len(rows)),
            "category_accuracy": _ratio(sum(categories[i] == predicted_categories[i]
                                            for i in rows), len(rows)),
        }
    return {
        "n": n,
        "accuracy": _ratio(sum(y == p for y, p in pairs), n),
        "macro_f1": round(sum(c["f1"] for c in per_class.values()) / len(LABELS), 4),
        "deterministic_precision": per_class["deterministic"]["precision"],
        # 95 % Wilson interval of the precision, from its counts: how sure the figure is
        "deterministic_precision_ci": list(wilson_interval(det_tp, det_decided)),
        "deterministic_decided": det_decided,
        "wrong_do_not_retry": det_decided - det_tp,
        "deterministic_recall": per_class["deterministic"]["recall"],
        "nondeterministic_recall": per_class["nondeterministic"]["recall"],
        "abstention_rate": _ratio(n - len(decided), n),
        "coverage": _ratio(len(decided), n),
        "decided_accuracy": _ratio(sum(y == p for y, p in decided), len(decided)),
        "category_accuracy": _ratio(sum(c == p for c, p in zip(categories, predicted_categories,
                                                               strict=True)), n),
        "per_class": per_class,
        "confusion": confusion,
        "per_category": per_category,
    }
