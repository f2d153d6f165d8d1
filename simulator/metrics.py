"""What a replay cost and delivered, per policy, and the table that compares policies.

Futile retries are retry attempts (not first attempts) that failed: GPU time a perfect policy
would not have spent. JCT runs from submission to the end of a job's last attempt, whatever its
fate; queueing delay sums the waits before each of its attempts. Utilization is busy GPU time
over capacity; "useful" is the share of that busy time spent on attempts that did not fail.
Both are reckoned over the arrival window (first to last submission; until the last end when
all jobs arrive at once) so that the drain of a few long jobs after the last arrival does not
dilute them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from sibylla.simulator.scheduler import SimResult

__all__ = ["PolicyMetrics", "deterministic_shares", "format_table", "jct_hours", "measure"]

HOUR_S = 3600.0


@dataclass(frozen=True, slots=True)
class PolicyMetrics:
    policy: str
    jobs: int
    success_rate: float
    futile_retry_gpu_h: float
    failed_gpu_h: float
    busy_gpu_h: float
    mean_jct_h: float
    p95_jct_h: float
    mean_queue_h: float
    utilization: float
    useful_share: float


def jct_hours(result: SimResult) -> np.ndarray:
    """Job completion time of every job, in hours."""
    submit = np.fromiter((j.submit for j in result.jobs), float, len(result.jobs))
    return (np.asarray(result.finished) - submit) / HOUR_S


def measure(result: SimResult) -> PolicyMetrics:
    first = min(j.submit for j in result.jobs)
    last = max(j.submit for j in result.jobs)
    if last <= first:  # every job arrived at once: the window runs until the last one ends
        last = max(result.finished)
    busy = futile = failed = queue = window_busy = window_failed = 0.0
    for a in result.attempts:
        gpu_s = a.gpus * (a.end - a.start)
        busy += gpu_s
        queue += a.start - a.enqueued
        in_window = a.gpus * max(0.0, min(a.end, last) - max(a.start, first))
        window_busy += in_window
        if a.result == "failed":
            failed += gpu_s
            window_failed += in_window
            if a.number > 0:
                futile += gpu_s
    n = len(result.jobs)
    jct = jct_hours(result)
    span = last - first
    return PolicyMetrics(
        policy=result.policy,
        jobs=n,
        success_rate=sum(s == "pass" for s in result.status) / n,
        futile_retry_gpu_h=futile / HOUR_S,
        failed_gpu_h=failed / HOUR_S,
        busy_gpu_h=busy / HOUR_S,
        mean_jct_h=float(jct.mean()),
        p95_jct_h=float(np.percentile(jct, 95)),
        mean_queue_h=queue / n / HOUR_S,
        utilization=window_busy / (result.total_gpus * span) if span > 0 else 0.0,
        useful_share=(window_busy - window_failed) / window_busy if window_busy else 0.0,
    )


def format_table(rows: Sequence[PolicyMetrics], baseline: str | None = None) -> str:
    """A plain-text table; with ``baseline``, JCT columns also show the change against it."""
    base = next((r for r in rows if r.policy == baseline), None)
    header = (
        f"{'policy':<14}{'success':>9}{'futile GPU-h':>14}{'failed GPU-h':>14}"
        f"{'mean JCT h':>12}{'p95 JCT h':>11}{'queue h':>9}{'util':>7}{'useful':>8}"
    )
    lines = [header, "-" * len(header)]
    for r in rows:
        line = (
            f"{r.policy:<14}{r.success_rate:>9.2%}{r.futile_retry_gpu_h:>14,.0f}"
            f"{r.failed_gpu_h:>14,.0f}{r.mean_jct_h:>12.2f}{r.p95_jct_h:>11.2f}"
            f"{r.mean_queue_h:>9.2f}{r.utilization:>7.1%}{r.useful_share:>8.1%}"
        )
        if base is not None and r is not base and base.mean_jct_h > 0:
            line += f"   JCT {r.mean_jct_h / base.mean_jct_h - 1:+.1%}"
        lines.append(line)
    return "\n".join(lines)


def deterministic_shares(result: SimResult) -> tuple[float, float]:
    """Share of jobs, and of busy GPU time, that deterministic failures account for."""
    jobs = result.jobs
    job_share = sum(j.outcome == "deterministic" for j in jobs) / len(jobs)
    busy = det = 0.0
    for a in result.attempts:
        gpu_s = a.gpus * (a.end - a.start)
        busy += gpu_s
        if jobs[a.job].outcome == "deterministic":
            det += gpu_s
    return job_share, det / busy if busy else 0.0
