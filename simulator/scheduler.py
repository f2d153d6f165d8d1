"""Discrete-event replay of a trace on a GPU cluster: FIFO with EASY backfill.

Jobs queue in the order they (or their retries) arrive. When the head of the queue does not fit,
it gets a reservation at the earliest time enough GPUs free up (reckoned on the cluster's total
free GPUs, the usual EASY simplification), and later jobs may start now if they fit and either
end before that time or only use GPUs the head will not need. Run-time estimates are exact (the
simulator knows them), the optimistic case for backfill. Only the first ``backfill_depth``
queued jobs are considered, as production schedulers bound it, which keeps a pass cheap.

A failed attempt holds its GPUs until it dies; the policy then decides whether it queues again.
Random outcomes (does a retry of a nondeterministic failure succeed?) are drawn from generators
seeded by (seed, job, attempt), so every policy replays the same world.
"""

from __future__ import annotations

import bisect
import heapq
import random
from collections import OrderedDict
from dataclasses import dataclass
from itertools import islice
from typing import Literal

from sibylla.simulator.cluster import Allocation, Cluster
from sibylla.simulator.jobs import Job
from sibylla.simulator.policies import RetryPolicy

__all__ = ["Attempt", "SimResult", "attempt_outcome", "simulate"]

Result = Literal["pass", "killed", "failed"]
_END, _ARRIVAL = 0, 1  # at equal times, free GPUs before admitting arrivals


@dataclass(frozen=True, slots=True)
class Attempt:
    """One run of a job: when it queued, ran and ended, where, and how it ended."""

    job: int
    number: int
    enqueued: float
    start: float
    end: float
    gpus: int
    allocation: Allocation
    result: Result


@dataclass(slots=True)
class SimResult:
    """Everything a replay produced; :mod:`metrics` turns it into numbers."""

    policy: str
    jobs: list[Job]
    attempts: list[Attempt]
    status: list[Result]  # per job: how its last attempt ended
    finished: list[float]  # per job: when its last attempt ended
    total_gpus: int


def attempt_outcome(job: Job, number: int, seed: int, retry_success: float
                    ) -> tuple[float, Result]:
    """Run time and result of attempt ``number`` (0-based) of ``job``: a deterministic failure
    dies at the same point every time, a failed retry of a nondeterministic one at a random
    point of its run."""
    if job.outcome == "pass":
        return job.duration, "pass"
    if job.outcome == "killed":
        return job.duration, "killed"
    if job.outcome == "deterministic" or number == 0:
        return job.fail_after, "failed"
    draw = random.Random(f"{seed}/{job.job_id}/{number}")
    if draw.random() < retry_success:
        return job.duration, "pass"
    return max(job.duration * draw.random(), 1.0), "failed"


def simulate(
    jobs: list[Job],
    policy: RetryPolicy,
    servers: int,
    gpus_per_server: int = 8,
    retry_success: float = 0.8,
    seed: int = 0,
    backfill_depth: int = 64,
) -> SimResult:
    """Replay ``jobs`` under ``policy`` and return every attempt and each job's fate."""
    cluster = Cluster(servers, gpus_per_server)
    for job in jobs:
        if -(-job.gpus // gpus_per_server) > servers or job.gpus > cluster.total_gpus:
            raise ValueError(f"job {job.job_id} needs {job.gpus} GPUs; the cluster is smaller")
    events: list[tuple[float, int, int]] = [(j.submit, _ARRIVAL, i) for i, j in enumerate(jobs)]
    heapq.heapify(events)
    # seq -> (job, attempt number, enqueued, run time, result), in the order they queued
    queue: OrderedDict[int, tuple[int, int, float, float, Result]] = OrderedDict()
    running: dict[int, Attempt] = {}
    ends: list[tuple[float, int, int]] = []  # (end, seq, gpus) of running attempts, sorted
    attempts: list[Attempt] = []
    status: list[Result] = ["failed"] * len(jobs)
    finished = [0.0] * len(jobs)
    seq = 0

    def enqueue(i: int, number: int, now: float) -> None:
        nonlocal seq
        queue[seq] = (i, number, now, *attempt_outcome(jobs[i], number, seed, retry_success))
        seq += 1

    def start(key: int, now: float) -> None:
        i, number, enqueued, run, result = queue.pop(key)
        attempt = Attempt(
            i, number, enqueued, now, now + run, jobs[i].gpus, cluster.place(jobs[i].gpus), result
        )
        running[key] = attempt
        bisect.insort(ends, (attempt.end, key, attempt.gpus))
        heapq.heappush(events, (attempt.end, _END, key))

    def reservation(gpus: int, now: float) -> tuple[float, int]:
        """When the blocked head could start, and the GPUs to spare for backfill then."""
        free = cluster.free_gpus
        if free >= gpus:  # enough GPUs, but scattered: reserve them now, lend only the rest
            return now, free - gpus
        for end, _, taken in ends:
            free += taken
            if free >= gpus:
                return end, free - gpus
        raise RuntimeError("a job larger than the cluster reached the queue")

    def schedule(now: float) -> None:
        shadow: float | None = None
        spare = 0
        for key, (i, _, _, run, _) in list(islice(queue.items(), backfill_depth)):
            if cluster.free_gpus == 0:
                return
            gpus = jobs[i].gpus
            if not cluster.fits(gpus):
                if shadow is None:
                    shadow, spare = reservation(gpus, now)
                continue
            if shadow is None or now + run <= shadow:
                start(key, now)
            elif gpus <= spare:
                spare -= gpus
                start(key, now)

    while events:
        now, kind, x = heapq.heappop(events)
        if kind == _ARRIVAL:
            enqueue(x, 0, now)
        else:
            attempt = running.pop(x)
            cluster.release(attempt.allocation)
            del ends[bisect.bisect_left(ends, (attempt.end, x, attempt.gpus))]
            attempts.append(attempt)
            i = attempt.job
            if attempt.result == "failed" and policy.retry(i, jobs[i], attempt.number):
                enqueue(i, attempt.number + 1, now)
            else:
                status[i], finished[i] = attempt.result, now
        if queue and (not events or events[0][0] > now):
            schedule(now)
    return SimResult(policy.name, jobs, attempts, status, finished, cluster.total_gpus)
