"""Scoring the model and every baseline on corpus records, on the same records.

The baselines that learn (the two TF-IDF regressions) are trained on exactly the records the
model was trained on, rebuilt from the training config in the model's metadata, so that every
row of the table has seen the same data. Records whose source was in the training data are
reported, never hidden: a score on them is not a held-out score.

Beyond the table, what a user needs before trusting ``do_not_retry``:

- the deterministic precision's 95 % Wilson interval (a precision on 40 decisions is vague);
- the cost curve: deterministic precision against abstention as the confidence threshold rises
  (the threshold a deterministic verdict needs: a transient one never abstains, see
  :func:`~.engine.at_threshold`);
- the operating point cross-fitted by project: for each repository in turn, the threshold is
  chosen on the *other* repositories' logs (the one whose deterministic precision has the
  highest lower confidence bound within the abstention cap, the lowest such) and applied to
  the held-out repository's logs; the pooled predictions are scored like any row;
- the evidence hit rate: on records annotated with their ``cause`` line, how often one of the
  decision's evidence lines contains it.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np

from .api import Classifier, LogWindow, Prediction
from .baselines import CharTfidfLogReg, ConstantVerdict, RegexRules, TfidfLogReg
from .corpus import Record, project_of
from .engine import EVIDENCE_LINES, NO_LOG, ModelClassifier, at_threshold, withheld
from .metrics import score, wilson_bounds, wilson_interval
from .preprocess import redact, select_lines, window_from_text
from .taxonomy import DETERMINISTIC, LABELS
from .train import TrainConfig, default_training_records

__all__ = [
    "COST_THRESHOLDS",
    "choose_operating_threshold",
    "cost_curve",
    "cross_fitted",
    "classifier_predictions",
    "evaluate_classifier",
    "evaluate_file",
    "evidence_hits",
    "format_report",
    "format_table",
    "headroom",
    "report_from_predictions",
]

logger = logging.getLogger(__name__)

TABLE_KEYS = ("accuracy", "macro_f1", "deterministic_precision", "deterministic_recall",
              "nondeterministic_recall", "abstention_rate")
COST_THRESHOLDS = (0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95, 0.97, 0.99)
TARGET_PRECISION = 0.98
MAX_ABSTENTION = 0.15
_GRID = np.round(np.arange(0.50, 0.995, 0.01), 2)


def _predict(classifier: Classifier, windows: Sequence[LogWindow], batch: int = 64
             ) -> list[Prediction]:
    out: list[Prediction] = []
    for start in range(0, len(windows), batch):
        out += classifier.predict(windows[start : start + batch])
    return out


def _score(records: Sequence[Record], verdicts: Sequence[str],
           predictions: Sequence[Prediction]) -> dict[str, Any]:
    return score([r.label for r in records], verdicts, [r.category for r in records],
                 [p.category for p in predictions])


def evaluate_classifier(classifier: Classifier, records: Sequence[Record], batch: int = 64,
                        windows: Sequence[LogWindow] | None = None) -> dict[str, Any]:
    """Metrics of ``classifier`` on ``records`` (see :func:`.metrics.score`); ``windows``:
    the records' windows when already built (several classifiers on the same records)."""
    if windows is None:
        windows = [window_from_text(r.log, job_id=r.id) for r in records]
    predictions = _predict(classifier, windows, batch)
    return _score(records, [p.verdict for p in predictions], predictions)


def _leaning(p: Prediction) -> str:
    """The verdict a prediction leans to, abstaining or not (its category says which)."""
    if p.verdict != "unknown":
        return p.verdict
    if p.category == NO_LOG:
        return "unknown"
    return LABELS[0] if p.category in DETERMINISTIC else LABELS[1]


def _at_threshold(predictions: Sequence[Prediction], threshold: float) -> list[str]:
    """Each prediction's lean, or ``unknown`` where it is withheld at ``threshold``."""
    leans = map(_leaning, predictions)
    return ["unknown" if withheld(lean, p.confidence, threshold) else lean
            for lean, p in zip(leans, predictions, strict=True)]


def cost_curve(predictions: Sequence[Prediction], records: Sequence[Record],
               thresholds: Sequence[float] = COST_THRESHOLDS) -> list[dict[str, Any]]:
    """Deterministic precision (with its interval), abstention and macro-F1 per threshold."""
    out = []
    for t in thresholds:
        m = _score(records, _at_threshold(predictions, t), predictions)
        out.append({"threshold": t, **{k: m[k] for k in (
            "deterministic_precision", "deterministic_precision_ci", "wrong_do_not_retry",
            "abstention_rate", "macro_f1")}})
    return out


class _Grid:
    """Per threshold of the grid and per record: decided, decided deterministic, and right."""

    def __init__(self, predictions: Sequence[Prediction], records: Sequence[Record]) -> None:
        conf = np.array([p.confidence for p in predictions])
        lean = [_leaning(p) for p in predictions]
        lean_det = np.array([v == LABELS[0] for v in lean])
        lean_nondet = np.array([v == LABELS[1] for v in lean])
        truth_det = np.array([r.label == LABELS[0] for r in records])
        # engine.withheld over the grid: only a deterministic lean needs the threshold
        self.det = (conf[None, :] >= _GRID[:, None]) & lean_det[None, :]  # (G, N)
        self.decided = self.det | lean_nondet[None, :]
        self.det_right = self.det & truth_det[None, :]

    def choose(self, rows: np.ndarray, target: float, max_abstention: float
               ) -> tuple[float, str]:
        """The threshold chosen on the records ``rows`` (a boolean mask), and by which rule."""
        n = max(1, int(rows.sum()))
        decided = (self.decided & rows).sum(1)
        det = (self.det & rows).sum(1)
        right = (self.det_right & rows).sum(1)
        allowed = (1 - decided / n <= max_abstention + 1e-9) & (det > 0)
        lower = wilson_bounds(right, det)[0]
        candidates = np.flatnonzero(allowed)
        if not len(candidates):
            return float(_GRID[0]), "none allowed"
        # Precision first: spend the abstention budget on the surest do_not_retry (the
        # highest lower bound; the lowest such threshold), not on the first threshold whose
        # point estimate reaches the target, which a few lucky logs decide, nor on the first
        # whose bound does, while a surer one is within the cap.
        best = candidates[np.argmax(lower[candidates])]
        return float(_GRID[best]), "lower bound" if lower[best] >= target else "best lower bound"


def choose_operating_threshold(predictions: Sequence[Prediction], records: Sequence[Record],
                               target: float = TARGET_PRECISION,
                               max_abstention: float = MAX_ABSTENTION) -> tuple[float, str]:
    """The confidence threshold whose deterministic precision on ``records`` has the highest
    95 % lower bound with at most ``max_abstention`` abstaining (the lowest such), and the
    rule: ``lower bound`` when that bound reaches ``target``, else ``best lower bound``."""
    return _Grid(predictions, records).choose(np.ones(len(records), bool), target,
                                              max_abstention)


def operating_threshold(classifier: ModelClassifier, records: Sequence[Record]
                        ) -> tuple[float, str]:
    """:func:`choose_operating_threshold` of ``classifier`` on ``records``: the threshold a
    model ships with, chosen on real logs of projects it never trained on."""
    windows = [window_from_text(r.log, job_id=r.id) for r in records]
    return choose_operating_threshold(_predict(classifier.with_threshold(0.0), windows),
                                      records)


def cross_fitted(predictions: Sequence[Prediction], records: Sequence[Record],
                 target: float = TARGET_PRECISION, max_abstention: float = MAX_ABSTENTION
                 ) -> dict[str, Any]:
    """Leave-one-project-out operating point: each repository's logs are decided at the
    threshold chosen (:func:`choose_operating_threshold`) on every other repository's logs.
    ``predictions`` must not abstain (threshold 0). Returns the pooled scores, the thresholds
    chosen and by which rule."""
    grid = _Grid(predictions, records)
    projects = [project_of(r) for r in records]
    verdicts: list[str] = ["unknown"] * len(records)
    thresholds: list[float] = []
    rules: Counter[str] = Counter()
    project_arr = np.array(projects)
    for project in sorted(set(projects)):
        held = project_arr == project
        threshold, rule = grid.choose(~held, target, max_abstention)
        thresholds.append(threshold)
        rules[rule] += 1
        rows = np.flatnonzero(held).tolist()
        for i, verdict in zip(rows, _at_threshold([predictions[i] for i in rows], threshold),
                              strict=True):
            verdicts[i] = verdict
    metrics = _score(records, verdicts, predictions)
    return {**metrics, "projects": len(thresholds), "target_precision": target,
            "max_abstention": max_abstention,
            "threshold_range": [min(thresholds, default=0.0), max(thresholds, default=0.0)],
            "threshold_median": float(np.median(thresholds)) if thresholds else 0.0,
            "rules": dict(rules)}


def _normalise(line: str) -> str:
    return " ".join(redact(line).split())


def cause_in_evidence(cause: str, evidence: Sequence[str]) -> bool:
    """Whether an evidence line contains the annotated cause line (whitespace collapsed,
    secrets redacted as in evidence), or is most of it (a line the window cut)."""
    want = _normalise(cause)
    if not want:
        return False
    for line in evidence:
        got = _normalise(line)
        if want in got or (got and got in want and 2 * len(got) >= len(want)):
            return True
    return False


def evidence_hits(predictions: Sequence[Prediction], records: Sequence[Record],
                  candidates: Sequence[int] | None = None) -> dict[str, Any]:
    """On the records with a ``cause``: how often the evidence lines contain it; and, with
    ``candidates`` (per record, how many lines the evidence could be chosen from), the same
    on the records offering more lines than the evidence shows (where a hit is not free)."""
    pairs = [(p, r, c) for p, r, c in zip(predictions, records, candidates or [0] * len(records),
                                          strict=True) if r.cause]
    hit = [cause_in_evidence(r.cause, p.evidence) for p, r, _ in pairs]
    out: dict[str, Any] = {"n": len(pairs), "hits": sum(hit),
                           "hit_rate": round(sum(hit) / len(pairs), 4) if pairs else 0.0,
                           "hit_rate_ci": list(wilson_interval(sum(hit), len(pairs)))}
    if candidates is not None:
        hard = [h for h, (_, _, c) in zip(hit, pairs, strict=True) if c > EVIDENCE_LINES]
        out.update(n_more_lines_than_evidence=len(hard), hits_more_lines=sum(hard),
                   hit_rate_more_lines=round(sum(hard) / len(hard), 4) if hard else 0.0)
    return out


def _last_lines(window: LogWindow) -> Prediction:
    """A naive explainer for comparison: the window's last distinct lines."""
    first, tail = select_lines(window)
    shown = [line.shown for line in (*first, *tail) if line.shown]
    return Prediction("unknown", 0.0, NO_LOG, shown[-EVIDENCE_LINES:])


def classifier_predictions(model: ModelClassifier, records: Sequence[Record],
                           train_records: Sequence[Record], windows: Sequence[LogWindow]
                           ) -> dict[str, list[Prediction]]:
    """Every row's predictions on ``records`` (whose windows are ``windows``): the model at its
    threshold and without one, and each baseline, the TF-IDF ones fitted on ``train_records``."""
    train_windows = [window_from_text(r.log) for r in train_records]
    train_categories = [r.category for r in train_records]
    baselines: dict[str, Classifier] = {
        "regex rules": RegexRules(),
        "tf-idf + logistic regression": TfidfLogReg().fit(train_windows, train_categories),
        "char tf-idf + logistic regression": CharTfidfLogReg().fit(train_windows,
                                                                    train_categories),
        "always retry": ConstantVerdict("nondeterministic"),
        "never retry": ConstantVerdict("deterministic"),
    }
    # The model runs once: at its threshold it decides as without one, abstaining below it.
    unthresholded = _predict(model.with_threshold(0.0), windows)
    return {"model": [at_threshold(p, model.threshold) for p in unthresholded],
            "model, no abstention": unthresholded,
            **{name: _predict(c, windows) for name, c in baselines.items()}}


def headroom(model: Sequence[Prediction], baseline: Sequence[Prediction],
             records: Sequence[Record]) -> dict[str, Any]:
    """Where the model without abstention and a baseline err: on the same logs, or each on
    its own. ``macro_f1_without_own_errors`` is the model's score had it made none of the
    errors the baseline avoids: the most it can lead the baseline by without getting right a
    log the baseline gets wrong too (on the real corpus, mostly logs whose symptom reads one
    way and whose thread resolved the other: an NCCL timeout that was a configuration
    error)."""
    both = own = theirs = 0
    fixed = []
    for record, ours, base in zip(records, model, baseline, strict=True):
        ours_wrong, base_wrong = ours.verdict != record.label, base.verdict != record.label
        both += ours_wrong and base_wrong
        own += ours_wrong and not base_wrong
        theirs += base_wrong and not ours_wrong
        fixed.append(record.label if ours_wrong and not base_wrong else ours.verdict)
    return {"both_wrong": both, "only_model_wrong": own, "only_baseline_wrong": theirs,
            "macro_f1_without_own_errors": _score(records, fixed, model)["macro_f1"]}


def report_from_predictions(records: Sequence[Record], windows: Sequence[LogWindow],
                            predictions: dict[str, list[Prediction]]) -> dict[str, Any]:
    """Rows, cross-fitted operating points, cost curves and evidence hit rates from every
    row's predictions (``"model, no abstention"`` and the baselines at least; ``"model"``,
    the model at its own threshold, when it has one). The headline is ``"model"``, else the
    model at the threshold cross-fitted by project."""
    rows = {name: _score(records, [p.verdict for p in preds], preds)
            for name, preds in predictions.items()}
    crossed = {}
    for name, base in (("model", "model, no abstention"),
                       ("tf-idf", "tf-idf + logistic regression"),
                       ("char tf-idf", "char tf-idf + logistic regression")):
        crossed[name] = cross_fitted(predictions[base], records)
        rows[f"{name}, cross-fitted threshold"] = crossed[name]
    headline = rows.get("model", rows["model, cross-fitted threshold"])
    evidence_of = predictions.get("model", predictions["model, no abstention"])
    candidates = [sum(bool(line.shown) for part in select_lines(w) for line in part)
                  for w in windows]
    return {**{k: headline[k] for k in TABLE_KEYS},
            "deterministic_precision_ci": headline["deterministic_precision_ci"],
            "coverage": headline["coverage"], "n": len(records),
            "projects": len({project_of(r) for r in records}),
            "model": headline, "rows": rows, "cross_fitted": crossed,
            "cost_curve": {"model": cost_curve(predictions["model, no abstention"], records),
                           "char tf-idf": cost_curve(
                               predictions["char tf-idf + logistic regression"], records)},
            "headroom": {"char tf-idf": headroom(
                predictions["model, no abstention"],
                predictions["char tf-idf + logistic regression"], records)},
            "evidence": {"model": evidence_hits(evidence_of, records, candidates),
                         "last lines (naive)": evidence_hits(
                             [_last_lines(w) for w in windows], records, candidates)}}


def evaluate_file(model: ModelClassifier, records: Sequence[Record],
                  train_records: Sequence[Record] | None = None) -> dict[str, Any]:
    """The model (at its threshold, without abstention, and at a cross-fitted threshold) and
    every baseline on ``records``, with the model's cost curve and evidence hit rate.

    ``train_records`` defaults to the model's own training data, rebuilt from its metadata.
    """
    if train_records is None:
        train_records = default_training_records(TrainConfig.from_meta(model.meta))
    train_sources = {r.source for r in train_records}
    overlap = sum(r.source in train_sources for r in records)
    if overlap:
        logger.warning("%d of %d records come from sources in the training data: "
                       "their scores are not held-out scores", overlap, len(records))
    windows = [window_from_text(r.log, job_id=r.id) for r in records]
    report = report_from_predictions(
        records, windows, classifier_predictions(model, records, train_records, windows))
    return {**report, "model_version": model.version, "threshold": model.threshold,
            "overlap_with_training": overlap}


def format_table(report: dict[str, Any]) -> str:
    """The comparison table as Markdown, deterministic precision with its 95 % interval."""
    keys = [k for k in TABLE_KEYS if k != "abstention_rate"]
    header = "| classifier | " + " | ".join(keys) + " | 95 % CI | abstention_rate |"
    lines = [header, "|" + "---|" * (len(keys) + 3)]
    for name, row in report["rows"].items():
        lo, hi = row["deterministic_precision_ci"]
        lines.append(f"| {name} | " + " | ".join(f"{row[k]:.3f}" for k in keys)
                     + f" | [{lo:.3f}, {hi:.3f}] | {row['abstention_rate']:.3f} |")
    return "\n".join(lines)


def format_report(report: dict[str, Any]) -> str:
    """Table, cross-fitted operating points, cost curves and evidence hit rates."""
    out = [format_table(report), ""]
    for name, c in report["cross_fitted"].items():
        lo, hi = c["deterministic_precision_ci"]
        out.append(f"{name}, threshold chosen on the other projects ({c['projects']} held out "
                   f"in turn; target {c['target_precision']}, abstention <= "
                   f"{c['max_abstention']}): deterministic precision "
                   f"{c['deterministic_precision']:.3f} [{lo:.3f}, {hi:.3f}] on "
                   f"{c['deterministic_decided']} do_not_retry ({c['wrong_do_not_retry']} "
                   f"wrong), coverage {c['coverage']:.3f}, macro-F1 {c['macro_f1']:.3f}; "
                   f"thresholds {c['threshold_range'][0]:.2f}-{c['threshold_range'][1]:.2f} "
                   f"(median {c['threshold_median']:.2f}), rules {c['rules']}")
    for name, curve in report["cost_curve"].items():
        out += ["", f"cost curve, {name}: | threshold | det. precision | 95 % CI | wrong "
                    "do_not_retry | abstention | macro-F1 |"]
        for pt in curve:
            lo, hi = pt["deterministic_precision_ci"]
            out.append(f"  | {pt['threshold']:.2f} | {pt['deterministic_precision']:.3f} | "
                       f"[{lo:.3f}, {hi:.3f}] | {pt['wrong_do_not_retry']} | "
                       f"{pt['abstention_rate']:.3f} | {pt['macro_f1']:.3f} |")
    out.append("")
    for name, h in report["headroom"].items():
        out.append(f"model without abstention against {name}: both wrong on {h['both_wrong']} "
                   f"logs, only the model on {h['only_model_wrong']}, only {name} on "
                   f"{h['only_baseline_wrong']}; without its own errors the model would "
                   f"score macro-F1 {h['macro_f1_without_own_errors']:.3f}")
    for name, ev in report["evidence"].items():
        lo, hi = ev["hit_rate_ci"]
        out.append(f"evidence hit rate, {name}: {ev['hits']}/{ev['n']} records with a cause "
                   f"line = {ev['hit_rate']:.3f} [{lo:.3f}, {hi:.3f}]; on the "
                   f"{ev.get('n_more_lines_than_evidence', 0)} offering more than "
                   f"{EVIDENCE_LINES} lines: {ev.get('hit_rate_more_lines', 0.0):.3f}")
    return "\n".join(out)
