"""Scoring a model on a validation set, and the promotion gate.

A candidate replaces the current model only if, on examples it never trained on, it is not
worse beyond a tolerance on every part of the validation set (the real logs and the held-back
recent labels: improving on the new failures must not cost the old ones), and its
``deterministic`` precision does not drop (beyond ``precision_tolerance``, by default about one
more false ``do_not_retry`` in a hundred: with zero, a candidate that stops ten more failing
jobs rightly and one wrongly is refused): a wrong ``do_not_retry`` kills a job that would have
succeeded, so that number may not get worse for the sake of accuracy.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from sibylla.inference.api import Classifier
from sibylla.inference.corpus import Record
from sibylla.inference.evaluate import evaluate_classifier
from sibylla.inference.train import Example

__all__ = ["GateResult", "Scores", "gate", "pooled_precision", "score"]


@dataclass(frozen=True)
class Scores:
    """How a model does on one set of labeled logs, as ``sibylla.inference.evaluate`` scores it.

    ``accuracy``: verdicts right (an ``unknown`` is never right); ``det_precision``: of the
    ``deterministic`` verdicts (those that stop a job), the share truly deterministic;
    ``det_decided``: how many such verdicts; ``coverage``: share of verdicts not ``unknown``.
    """

    n: int
    accuracy: float
    det_precision: float
    det_decided: int
    coverage: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def score(classifier: Classifier, examples: Sequence[Example]) -> Scores:
    if not examples:
        return Scores(0, 0.0, 0.0, 0, 0.0)
    records = [Record(str(i), ex.source, "", ex.category, ex.label, ex.log)
               for i, ex in enumerate(examples)]
    m = evaluate_classifier(classifier, records)
    decided_det = sum(row.get("deterministic", 0) for row in m["confusion"].values())
    return Scores(m["n"], m["accuracy"], m["deterministic_precision"], decided_det,
                  round(1.0 - m["abstention_rate"], 4))


@dataclass(frozen=True)
class GateResult:
    promote: bool
    reasons: list[str]  # why not (empty when promoted)


def pooled_precision(parts: Mapping[str, Scores]) -> tuple[float, int]:
    """Deterministic precision over all parts together, and how many verdicts it rests on."""
    decided = sum(s.det_decided for s in parts.values())
    right = sum(s.det_precision * s.det_decided for s in parts.values())
    return (right / decided if decided else 1.0), decided


def gate(current: Mapping[str, Scores], candidate: Mapping[str, Scores], tolerance: float,
         precision_tolerance: float, floor: Mapping[str, Scores] | None = None) -> GateResult:
    """Compare the two models (same parts, e.g. ``real`` and ``recent``): accuracy part by
    part, deterministic precision pooled over the parts (the held-back labels alone hold few
    ``deterministic`` verdicts: see the bias in docs/online_learning.md).

    ``floor``: scores of the first model on some parts. Without it, promotions that each lose
    a little less than the tolerance add up (a ratchet the drift experiment showed); with it,
    the candidate must also be within the tolerance of the first model there.
    """
    reasons = []
    for part, cur in current.items():
        cand = candidate[part]
        if cand.n and cand.accuracy < cur.accuracy - tolerance:
            reasons.append(f"{part}: accuracy {cand.accuracy:.4f} < {cur.accuracy:.4f} - "
                           f"{tolerance}")
    for part, first in (floor or {}).items():
        cand = candidate[part]
        if cand.n and cand.accuracy < first.accuracy - tolerance:
            reasons.append(f"{part}: accuracy {cand.accuracy:.4f} < the first model's "
                           f"{first.accuracy:.4f} - {tolerance}")
    (cur_p, _), (cand_p, cand_n) = pooled_precision(current), pooled_precision(candidate)
    if cand_n and cand_p < cur_p - precision_tolerance:
        reasons.append(f"deterministic precision {cand_p:.4f} < {cur_p:.4f} - "
                       f"{precision_tolerance}")
    return GateResult(not reasons, reasons)
