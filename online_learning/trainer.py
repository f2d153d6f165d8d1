"""The trainer: labels in, fine-tuned and gated candidates out. No Kafka here (see
``service.py`` for the process around it), so the drift experiment and the tests drive it
directly.

Where a label goes:
- a label only models voted for (no retry outcome, no operator) teaches the models nothing
  they did not already believe, and judging a candidate on it would reward agreeing with the
  current model: it goes to the replay buffer only, never counts as new, never validates;
- every ``holdout_every``-th other label (chosen by a hash of its job and attempt, so a
  relabeled attempt stays on its side) is held back for validation and never trained on;
- the rest are new examples; after ``finetune_every`` of them, or ``drift_min_labels`` while
  the committee disagrees with retry outcomes more than ``drift_threshold``, :meth:`step`
  fine-tunes the current model on them plus as many replayed older examples, scores both
  models on the real logs and the held-back labels, and promotes the candidate if the gate
  lets it through. The new examples then join the replay buffer, unless the gate refused
  them: a batch that made a worse model (mislabeled by noise or by an attacker) is dropped.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sibylla.inference.api import Classifier
from sibylla.inference.checkpoint import Checkpoint
from sibylla.inference.engine import ModelClassifier
from sibylla.inference.taxonomy import CATEGORIES, DETERMINISTIC, NONDETERMINISTIC, label_of
from sibylla.inference.train import Example
from sibylla.schemas.records import Label

from .finetune import fine_tune
from .gate import GateResult, Scores, gate, score
from .metrics import TrainerMetrics
from .replay import ReplayBuffer
from .settings import OnlineSettings
from .store import ModelEntry, ModelStore
from .votes import MODEL_PREFIX, OUTCOME, independent

__all__ = ["CandidateReport", "Trainer", "example_of"]

log = logging.getLogger(__name__)

FineTune = Callable[[Checkpoint, Sequence[Example], int, float, int], Checkpoint]

# A label says deterministic or not, not which category; when the decision's category belongs
# to the other verdict, the example gets the broadest category of its own verdict.
FALLBACK_CATEGORY = {"deterministic": DETERMINISTIC[1], "nondeterministic": NONDETERMINISTIC[4]}


def example_of(label: Label) -> Example:
    """The training example of a label (its category made consistent with its verdict)."""
    category = label.category
    if category not in CATEGORIES or label_of(category) != label.label:
        category = FALLBACK_CATEGORY[label.label]
    return Example(label.log, label.label, category, f"label/{label.job_id}/{label.attempt}")


@dataclass(frozen=True)
class CandidateReport:
    """One fine-tune: what triggered it, what it trained on, both models' scores, the gate."""

    version: str
    parent: str
    trigger: str
    n_new: int
    n_replay: int
    current: dict[str, Scores]
    candidate: dict[str, Scores]
    result: GateResult
    seconds: float


class Trainer:
    """See module docstring. ``base`` is the model to start from when the store has none."""

    def __init__(self, settings: OnlineSettings, store: ModelStore, base: Checkpoint,
                 real_validation: Sequence[Example], replay_seed: Sequence[Example] = (),
                 metrics: TrainerMetrics | None = None, tune: FineTune = fine_tune,
                 seed: int = 0) -> None:
        self.s = settings
        self.store = store
        self.metrics = metrics or TrainerMetrics()
        self.tune = tune
        self.seed = seed
        self.real_validation = list(real_validation)
        self.replay = ReplayBuffer(settings.replay_size, seed)
        self.replay.extend(replay_seed)
        self.new: OrderedDict[str, tuple[Example, float]] = OrderedDict()
        self.holdout: OrderedDict[str, Example] = OrderedDict()
        self._disagreement: deque[float] = deque(maxlen=settings.drift_window)
        current = store.current
        if current is None:
            version = str(base.meta.get("version", "base"))
            store.record(ModelEntry(version, "base"), base)
            current = store.set_current(version)
            self.checkpoint = base
        else:
            self.checkpoint = store.load(current)
        self.trained_until = current.trained_until
        self._floor: dict[str, Scores] = {}  # the first model's scores on the real logs
        self._real_scores: dict[str, Scores] = {}  # model version -> its score on them
        self.classifier: Classifier = ModelClassifier(self.checkpoint, device="cpu")
        self.metrics.set_model(self.classifier.version)

    # ------------------------------------------------------------------ labels
    def add_label(self, label: Label) -> str:
        """File one label; returns where it went (``new``, ``holdout``, ``replay``,
        ``skipped``). A label no newer than the current model's training data only refills
        the replay buffer (a restarted trainer re-reads the topic); a held-back label stays
        held back whenever it is read."""
        use = self._file(label)
        self.metrics.labels.labels(use=use).inc()
        return use

    def _file(self, label: Label) -> str:
        if not label.log.strip():
            return "skipped"
        example = example_of(label)
        key = f"{label.job_id}\x00{label.attempt}"
        if not independent(label.votes):
            self.replay.add(example)
            return "replay"
        if int(hashlib.sha256(key.encode()).hexdigest(), 16) % self.s.holdout_every == 0:
            self.holdout[key] = example
            self.holdout.move_to_end(key)
            while len(self.holdout) > self.s.holdout_size:
                self.holdout.popitem(last=False)
            return "holdout"
        if label.labeled_at <= self.trained_until:
            self.replay.add(example)
            return "replay"
        self._observe_drift(label)
        self.new[key] = (example, label.labeled_at)
        return "new"

    def _observe_drift(self, label: Label) -> None:
        outcome = next((v for v in label.votes if v.source == OUTCOME), None)
        models = [v for v in label.votes if v.source.startswith(MODEL_PREFIX)]
        if outcome is None or not models:
            return
        self._disagreement.append(sum(v.label != outcome.label for v in models) / len(models))
        self.metrics.drift.set(self.drift)

    @property
    def drift(self) -> float:
        """Recent share of committee votes contradicting the retry outcome."""
        return sum(self._disagreement) / len(self._disagreement) if self._disagreement else 0.0

    def due(self) -> str | None:
        """Why a fine-tune is due now (``labels`` or ``drift``), or None."""
        if len(self.new) >= self.s.finetune_every:
            return "labels"
        if (len(self.new) >= self.s.drift_min_labels
                and len(self._disagreement) >= self.s.drift_min_labels
                and self.drift >= self.s.drift_threshold):
            return "drift"
        return None

    # ------------------------------------------------------------------ fine-tune
    def validation(self) -> dict[str, list[Example]]:
        return {"real": self.real_validation, "recent": list(self.holdout.values())}

    def step(self, trigger: str) -> CandidateReport:
        """Fine-tune, score, gate; on success the candidate is stored and becomes current."""
        t0 = time.monotonic()
        self._follow_rollback()
        new = [ex for ex, _ in self.new.values()]
        newest = max(at for _, at in self.new.values())
        replayed = self.replay.sample(int(len(new) * self.s.replay_ratio))
        candidate = self.tune(self.checkpoint, new + replayed, self.s.finetune_epochs,
                              self.s.finetune_lr, self.seed)
        self.seed += 1
        cand_classifier = ModelClassifier(candidate, device="cpu")
        parts = self.validation()
        current_scores = self._scores(self.classifier, parts)
        cand_scores = self._scores(cand_classifier, parts)
        result = gate(current_scores, cand_scores, self.s.gate_tolerance,
                      self.s.gate_precision_tolerance, self._first_model_scores())
        if result.promote:  # a batch the gate refused is suspect: never replay it
            self.replay.extend(new)
        self.new.clear()
        self._disagreement.clear()
        parent = self.classifier.version
        entry = ModelEntry(cand_classifier.version, "promoted" if result.promote else "rejected",
                           scores={"candidate": {p: s.to_dict() for p, s in cand_scores.items()},
                                   "current": {p: s.to_dict() for p, s in current_scores.items()},
                                   "trigger": trigger, "n_new": len(new),
                                   "n_replay": len(replayed)},
                           reasons=result.reasons, parent=parent, trained_until=newest)
        if result.promote:
            self.store.record(entry, candidate)
            self.store.set_current(entry.version)
            self.checkpoint, self.classifier = candidate, cand_classifier
            self.trained_until = newest
            self.metrics.set_model(entry.version)
        else:
            self.store.record(entry)
        report = CandidateReport(entry.version, parent, trigger, len(new), len(replayed),
                                 current_scores, cand_scores, result,
                                 round(time.monotonic() - t0, 1))
        self._export(report)
        return report

    def _scores(self, model: Classifier, parts: dict[str, list[Example]]
                ) -> dict[str, Scores]:
        """``model``'s scores on each part. The real logs never change, so their score is kept
        per model version (the current model is not scored on them again at every step)."""
        out = {}
        for part, exs in parts.items():
            if part == "real":
                key = model.version
                if key not in self._real_scores:
                    self._real_scores[key] = score(model, exs)
                out[part] = self._real_scores[key]
            else:
                out[part] = score(model, exs)
        return out

    def _first_model_scores(self) -> dict[str, Scores]:
        """The store's first (base) model on the real logs: the floor no chain of promotions
        may sink below."""
        if not self._floor:
            first = next((e for e in self.store.entries() if e.status == "base"), None)
            if first is not None:
                model = (self.classifier if first.version == self.classifier.version
                         else ModelClassifier(self.store.load(first), device="cpu"))
                self._floor = self._scores(model, {"real": self.real_validation})
        return self._floor

    def _follow_rollback(self) -> None:
        """Start from the store's current model if an operator rolled back to another one."""
        current = self.store.current
        if current is None or current.version == self.classifier.version:
            return
        log.info("following the store's current model %s (rollback)", current.version)
        self.checkpoint = self.store.load(current)
        self.classifier = ModelClassifier(self.checkpoint, device="cpu")
        self.metrics.set_model(current.version)

    def _export(self, report: CandidateReport) -> None:
        m = self.metrics
        m.candidates.labels(result="promoted" if report.result.promote else "rejected").inc()
        m.set_scores("candidate", report.candidate)
        m.set_scores("current", report.current)
        m.finetune_seconds.set(report.seconds)
        log.info("candidate %s (from %s, %s: %d new + %d replayed) %s in %.1f s; current %s; "
                 "candidate %s%s", report.version, report.parent, report.trigger, report.n_new,
                 report.n_replay, "PROMOTED" if report.result.promote else "rejected",
                 report.seconds, {p: s.to_dict() for p, s in report.current.items()},
                 {p: s.to_dict() for p, s in report.candidate.items()},
                 "" if report.result.promote else f"; {'; '.join(report.result.reasons)}")
