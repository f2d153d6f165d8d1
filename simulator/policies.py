"""Retry policies: what the scheduler does after an attempt fails.

Every policy answers one question, ``retry(index, job, attempt)``, for the attempt (0-based) that
just failed. All share the same retry cap so that the comparison isolates the decision itself.
The Sibylla policies return the classifier's verdict: deterministic means do not retry,
nondeterministic means retry, unknown falls back to the fixed policy.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from sibylla.inference.api import LogWindow, Prediction
from sibylla.schemas.records import JobEvent
from sibylla.simulator.confusion import CLASSES, PREDICTIONS, ConfusionMatrix
from sibylla.simulator.jobs import Job
from sibylla.streams.attempts import AttemptFacts
from sibylla.streams.policy import Rules, apply_memory, make_decision

__all__ = [
    "ConfusionPolicy",
    "FixedRetries",
    "MemoryPolicy",
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
    the same trace sees the same verdicts whatever else changed. ``per_job``: one draw per job,
    reused for its later attempts, as the model does when a retry prints the same log again
    (the independent draws of the default are optimistic: a wrong verdict is soon corrected).
    """

    def __init__(self, matrix: ConfusionMatrix, max_retries: int = 3, seed: int = 0,
                 per_job: bool = False) -> None:
        self.matrix = matrix
        self.max_retries = max_retries
        self.seed = seed
        self.per_job = per_job
        self._cum = {c: _cumulative(matrix.rates(c)) for c in CLASSES}

    @property
    def name(self) -> str:
        return "sibylla-job" if self.per_job else "sibylla"

    def verdict(self, index: int, job: Job, attempt: int) -> str:
        draw = f"{self.seed}/{index}" if self.per_job else f"{self.seed}/{index}/{attempt}"
        u = random.Random(draw).random()
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


class MemoryPolicy(ConfusionPolicy):
    """Sibylla with memory: the same verdicts as :class:`ConfusionPolicy` with ``per_job`` (same
    draws), revised by the job's earlier attempts with the worker's own rules
    (:func:`sibylla.streams.policy.apply_memory`).

    What the trace tells the rules: an attempt's root is its job's failure (a deterministic job
    fails the same way every time; a flaky one with the same transient error), its progress is
    how long it ran (``run_time(job, attempt)``, the scheduler's
    :func:`~sibylla.simulator.scheduler.attempt_outcome`): a deterministic failure dies at the
    same step each time, a retried transient failure wherever it happens to.
    """

    def __init__(self, matrix: ConfusionMatrix, run_time: Callable[[Job, int], float],
                 max_retries: int = 3, seed: int = 0, rules: Rules | None = None) -> None:
        super().__init__(matrix, max_retries, seed, per_job=True)
        self.run_time = run_time
        self.rules = dataclasses.replace(rules or Rules(), max_retries=max_retries)
        self._history: dict[int, list[AttemptFacts]] = {}

    @property
    def name(self) -> str:
        return "sibylla-memory"

    def retry(self, index: int, job: Job, attempt: int) -> bool:
        if attempt >= self.max_retries:
            self._history.pop(index, None)
            return False
        verdict = self.verdict(index, job, attempt)
        category = job.category or job.outcome
        event = JobEvent(job.job_id, attempt, "finished", "FAILED", 1)
        first = make_decision(event, LogWindow(job.job_id, attempt, [category]),
                              Prediction(verdict, 0.9, category, []),  # type: ignore[arg-type]
                              self.name, 0.0, 0.0)
        history = self._history.setdefault(index, [])
        facts = AttemptFacts(attempt, category, category,
                             (0, int(self.run_time(job, attempt)), 0))
        decision, remembered = apply_memory(first, facts, history, self.rules)
        history.append(remembered)
        if decision.action == "do_not_retry":
            del self._history[index]
            return False
        return True
