"""Prometheus metrics of the online-learning loop: the trainer's and the worker's votes agent's.

Each on a registry passed in (the worker's own, so /metrics shows them beside the pipeline's).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge

if TYPE_CHECKING:
    from .gate import Scores

__all__ = ["TrainerMetrics", "VoteMetrics"]


class TrainerMetrics:
    """Labels taken in, every candidate's scores and outcome, the drift signal."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = r = registry or CollectorRegistry()
        self.labels = Counter("sibylla_trainer_labels", "Labels received, by where they went "
                              "(new, holdout, replay, skipped).", ["use"], registry=r)
        self.candidates = Counter("sibylla_trainer_candidates", "Fine-tuned candidates, by "
                                  "gate result.", ["result"], registry=r)
        self.scores = Gauge("sibylla_trainer_scores", "Scores of the last candidate and of the "
                            "model it was compared with, per validation part.",
                            ["model", "part", "metric"], registry=r)
        self.drift = Gauge("sibylla_trainer_drift", "Share of committee votes that disagree "
                           "with the retry outcome, over recent labels.", registry=r)
        self.finetune_seconds = Gauge("sibylla_trainer_finetune_seconds",
                                      "Duration of the last fine-tune.", registry=r)
        self.model_info = Gauge("sibylla_trainer_model_info", "The current model (value 1).",
                                ["version"], registry=r)

    def set_scores(self, model: str, scores: Mapping[str, Scores]) -> None:
        for part, s in scores.items():
            for metric in ("accuracy", "det_precision", "coverage"):
                self.scores.labels(model=model, part=part, metric=metric).set(getattr(s, metric))

    def set_model(self, version: str) -> None:
        self.model_info.clear()
        self.model_info.labels(version=version).set(1)


class VoteMetrics:
    """The worker side: votes cast, labels published, model announcements handled, operator
    requests refused."""

    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.votes = Counter("sibylla_votes", "Votes recorded, by kind.", ["kind"], registry=r)
        self.labels = Counter("sibylla_labels_published", "Labels published, by label.",
                              ["label"], registry=r)
        self.swaps = Counter("sibylla_model_swaps", "Announced models loaded and swapped in.",
                             registry=r)
        self.rejected = Counter("sibylla_model_announcements_rejected", "Announcements refused, "
                                "by reason (unsigned, bad_signature, replayed, outside_roots, "
                                "checksum, missing_file, unloadable, ...).", ["reason"],
                                registry=r)
        self.operator_refused = Counter("sibylla_operator_requests_refused", "Operator labels "
                                        "refused, by reason (missing_token, malformed, "
                                        "wrong_token, disabled).", ["reason"], registry=r)
        # Beside sibylla_model_info (the model in use): an operator alerts when they differ.
        self.announced = Gauge("sibylla_model_announced_info", "The latest model announced "
                               "for this worker's model name (value 1).", ["version"],
                               registry=r)

    def set_announced(self, version: str) -> None:
        self.announced.clear()
        self.announced.labels(version=version).set(1)
