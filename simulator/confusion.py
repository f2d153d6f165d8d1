"""The classifier's confusion matrix, as the Sibylla policy consumes it.

``sibylla evaluate --json`` measures how often each true class (deterministic,
nondeterministic) is predicted as deterministic, nondeterministic or unknown. The simulator
turns those counts into per-row probabilities and draws a verdict for every failed attempt, so
the replay shows what the measured classifier would save or lose. Several JSON shapes are
accepted because the evaluator's output may wrap the matrix in a larger report.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["ASSUMED", "CLASSES", "PREDICTIONS", "ConfusionMatrix"]

CLASSES = ("deterministic", "nondeterministic")
PREDICTIONS = ("deterministic", "nondeterministic", "unknown")
# Keys under which a report may nest the matrix; ``sibylla evaluate --json`` puts the shipped
# model's row under "model" and its matrix under "confusion".
_WRAPPERS = ("confusion_matrix", "confusion", "model")


@dataclass(frozen=True, slots=True)
class ConfusionMatrix:
    """Counts (or rates) of predicted verdicts per true class, and where they came from."""

    counts: Mapping[str, Mapping[str, float]]
    source: str

    def __post_init__(self) -> None:
        for true in CLASSES:
            row = self.counts.get(true)
            if row is None or sum(row.get(p, 0.0) for p in PREDICTIONS) <= 0:
                raise ValueError(f"confusion matrix needs a non-empty row for {true!r}")
            if any(row.get(p, 0.0) < 0 for p in PREDICTIONS):
                raise ValueError("confusion matrix entries must be >= 0")

    def rates(self, true: str) -> tuple[float, float, float]:
        """P(predicted = deterministic, nondeterministic, unknown | true class)."""
        row = self.counts[true]
        values = [float(row.get(p, 0.0)) for p in PREDICTIONS]
        total = sum(values)
        return (values[0] / total, values[1] / total, values[2] / total)

    @classmethod
    def from_numbers(cls, spec: str) -> ConfusionMatrix:
        """``DD,DN,ND,NN`` (true class first, predicted second) or six numbers with unknowns:
        ``DD,DN,DU,ND,NN,NU``."""
        try:
            values = [float(v) for v in spec.split(",")]
        except ValueError:
            raise ValueError(
                f"confusion numbers must be comma-separated numbers: {spec!r}"
            ) from None
        if len(values) == 4:
            values = [values[0], values[1], 0.0, values[2], values[3], 0.0]
        if len(values) != 6:
            raise ValueError("give 4 numbers (DD,DN,ND,NN) or 6 (DD,DN,DU,ND,NN,NU)")
        rows = {
            c: dict(zip(PREDICTIONS, values[3 * k : 3 * k + 3], strict=True))
            for k, c in enumerate(CLASSES)
        }
        return cls(rows, f"command line {spec}")

    @classmethod
    def from_json(cls, path: str | Path) -> ConfusionMatrix:
        doc = json.loads(Path(path).read_text())
        version = doc.get("model_version") if isinstance(doc, Mapping) else None
        return cls(_find_rows(doc), f"{path} (model {version})" if version else str(path))


def _rows_from_lists(labels: Sequence[str], matrix: Sequence[Sequence[float]]) -> dict:
    if len(matrix) != len(labels) or any(len(r) != len(labels) for r in matrix):
        raise ValueError("confusion matrix must be square with one row per label")
    return {
        true: {pred: matrix[i][j] for j, pred in enumerate(labels)} for i, true in enumerate(labels)
    }


def _find_rows(doc: Any) -> dict[str, dict[str, float]]:
    """Rows keyed by true class, from {true: {pred: n}}, {labels, matrix} or either wrapped."""
    if isinstance(doc, Mapping):
        if all(c in doc and isinstance(doc[c], Mapping) for c in CLASSES):
            return {c: dict(doc[c]) for c in CLASSES}
        if "labels" in doc and "matrix" in doc:
            return _rows_from_lists(doc["labels"], doc["matrix"])
        for key in _WRAPPERS:
            if key in doc:
                return _find_rows(doc[key])
    raise ValueError(
        "no confusion matrix found: expected {true: {predicted: count}}, "
        "{labels, matrix} or either under 'confusion_matrix', 'confusion' or 'model'"
    )


# Used only when no measurement is given, and always reported as an assumption: a classifier that
# recognises 90% of deterministic failures, wrongly blocks 2% of nondeterministic ones, and
# abstains on 5% of each (abstentions fall back to the scheduler's default policy).
ASSUMED = ConfusionMatrix(
    {
        "deterministic": {"deterministic": 0.90, "nondeterministic": 0.05, "unknown": 0.05},
        "nondeterministic": {"deterministic": 0.02, "nondeterministic": 0.93, "unknown": 0.05},
    },
    "ASSUMED (not measured): pass --confusion-json from `sibylla evaluate --json`",
)
