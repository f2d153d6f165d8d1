"""Retry policies: what the scheduler does after an attempt fails.

Every policy answers one question, ``retry(index, job, attempt)``, for the attempt (0-based) that
just failed. All share the same retry cap so that the comparison isolates the decision itself.
The Sibylla policies return the classifier's verdict: deterministic means do not retry,
nondeterministic means retry, unknown falls back to the fixed policy.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from sibylla.simulator.confusion import CLASSES, PREDICTIONS, ConfusionMatrix
from sibylla.simulator.jobs import Job

__all__ = [
    "ConfusionPolicy",
    "FixedRetries",
    "NeverRetry",
    "Oracle",
    "RetryPolicy",
    "VerdictPolicy",
]


class RetryPolicy(Protocol):
    """Decides whether the failed ``attempt`` of job number ``index`` is queued again."""

    @property
    def name(self) -> str: ...

    def retry(self, index: int, job: Job, attempt: int) -> bool: ...


@dataclass(frozen=True, slots=True)
class FixedRetries:
    """What schedulers do today: retry every failure up to ``max_retries`` times."""

    max_retries: int = 3

    @property
    def name(self) -> str:
        return f"fixed-{self.max_retries}"

    def retry(self, index: int, job: Job, attempt: int) -> bool:
        return attempt < self.max_retries


@dataclass(frozen=True, slots=True)
class NeverRetry:
    """Give up at the first failure: no futile retries, but every transient failure is lost."""

    @property
    def name(self) -> str:
        return "never"

    def retry(self, index: int, job: Job, attempt: int) -> bool:
        return False


@dataclass(frozen=True, slots=True)
class Oracle:
    """Knows the true class: the upper bound on what any classifier can save."""

    max_retries: int = 3

    @property
    def name(self) -> str:
        return "oracle"

    def retry(self, index: int, job: Job, attempt: int) -> bool:
        return job.outcome == "nondeterministic" and attempt < self.max_retries


class _Verdicts:
    """Shared by the Sibylla policies: act on a verdict, fall back to fixed retries on unknown."""

    max_retries: int

    def verdict(self, index: int, job: Job, attempt: int) -> str:
        raise NotImplementedError

    def retry(self, index: int, job: Job, attempt: int) -> bool:
        if attempt >= self.max_retries:
            return False
        return self.verdict(index, job, attempt) != "deterministic"


class ConfusionPolicy(_Verdicts):
    """Sibylla with a classifier that errs as the confusion matrix says.

    The verdict for (job, attempt) is drawn from a generator seeded by both, so every replay of
    the same trace sees the same verdicts whatever else changed.
    """

    def __init__(self, matrix: ConfusionMatrix, max_retries: int = 3, seed: int = 0) -> None:
        self.matrix = matrix
        self.max_retries = max_retries
        self.seed = seed
        self._cum = {c: _cumulative(matrix.rates(c)) for c in CLASSES}

    @property
    def name(self) -> str:
        return "sibylla"

    def verdict(self, index: int, job: Job, attempt: int) -> str:
        u = random.Random(f"{self.seed}/{index}/{attempt}").random()
        for prediction, edge in zip(PREDICTIONS, self._cum[job.outcome], strict=True):
            if u < edge:
                return prediction
        return PREDICTIONS[-1]


class VerdictPolicy(_Verdicts):
    """Sibylla with verdicts a model gave on generated logs, one per failed job (by job id)."""

    def __init__(self, verdicts: Mapping[str, str], max_retries: int = 3) -> None:
        self.verdicts = verdicts
        self.max_retries = max_retries

    @property
    def name(self) -> str:
        return "sibylla-model"

    def verdict(self, index: int, job: Job, attempt: int) -> str:
        return self.verdicts.get(job.job_id, "unknown")


def _cumulative(rates: tuple[float, float, float]) -> tuple[float, float, float]:
    return (rates[0], rates[0] + rates[1], 1.0)
