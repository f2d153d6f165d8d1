"""The job record every part of the simulator shares: what a trace says a job will do.

A job is described by what would happen on each attempt, not by what a scheduler did with it, so
one trace can be replayed under different retry policies. The outcome classes follow
TAXONOMY.md: a deterministic failure fails again on every retry; a nondeterministic one came from
the environment and may succeed when retried.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["FAILING", "Job", "Outcome"]

Outcome = Literal["pass", "killed", "deterministic", "nondeterministic"]

# Outcomes whose attempts end in a failure that a retry policy must judge.
FAILING: frozenset[str] = frozenset({"deterministic", "nondeterministic"})


@dataclass(frozen=True, slots=True)
class Job:
    """One submitted job.

    ``duration`` is the run time of a successful attempt (for ``killed`` jobs, the time until the
    user killed it); ``fail_after`` the run time of the first failed attempt, which a
    deterministic failure repeats on every retry. Times are seconds from the trace's start.
    """

    job_id: str
    submit: float
    gpus: int
    duration: float
    outcome: Outcome
    fail_after: float = 0.0
    category: str = ""

    def __post_init__(self) -> None:
        if self.gpus < 1:
            raise ValueError(f"job {self.job_id}: gpus must be >= 1, got {self.gpus}")
        if self.duration <= 0 or self.submit < 0:
            raise ValueError(f"job {self.job_id}: needs duration > 0 and submit >= 0")
        if self.outcome in FAILING and self.fail_after <= 0:
            raise ValueError(f"job {self.job_id}: a failing job needs fail_after > 0")
