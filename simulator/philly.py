"""Read Microsoft's public Philly trace (``cluster_job_log``) into :class:`Job` records.

The trace is a JSON list of jobs with ``status`` (Pass, Killed, Failed), ``submitted_time`` and
``attempts`` (each with ``start_time``, ``end_time`` and ``detail``: the hosts and GPUs used). It
records what Philly did, not why a job failed, so the failure class is inferred from the
attempts: a job that ended Failed failed on every retry Philly gave it (deterministic); a job
that passed after failed attempts was rescued by a retry (nondeterministic). Jobs without usable
times (logging gaps, still running at the snapshot) are skipped and counted.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import orjson

from sibylla.schemas.records import JobEvent
from sibylla.simulator.jobs import Job

__all__ = ["PhillyTrace", "jobs_from_philly", "philly_job_events", "read_philly", "read_raw"]

MIN_RUN_S = 1.0  # the trace has one-second resolution; a zero-length attempt still held GPUs


@dataclass(slots=True)
class PhillyTrace:
    """Jobs taken from a trace, and why the others were left out (reason -> count)."""

    jobs: list[Job]
    skipped: Counter[str] = field(default_factory=Counter)


def _time(value: Any) -> float | None:
    if not isinstance(value, str) or value in ("", "None"):
        return None
    try:
        return dt.datetime.fromisoformat(value).timestamp()
    except ValueError:
        return None


def _run(attempt: Mapping[str, Any]) -> float | None:
    start, end = _time(attempt.get("start_time")), _time(attempt.get("end_time"))
    if start is None or end is None or end < start:
        return None
    return max(end - start, MIN_RUN_S)


def _convert(raw: Mapping[str, Any]) -> Job | str:
    """One trace entry as a job, or the reason it cannot be replayed."""
    attempts = raw.get("attempts") or []
    submit = _time(raw.get("submitted_time"))
    if submit is None:
        return "no submitted_time"
    if not attempts:
        return "no attempts"
    gpus = sum(len(d.get("gpus") or []) for d in attempts[0].get("detail") or [])
    if gpus < 1:
        return "no GPUs recorded"
    runs = [_run(a) for a in attempts]
    if any(r is None for r in runs):
        return "attempt without start or end time"
    first, last = runs[0], runs[-1]
    assert first is not None and last is not None
    job_id = str(raw.get("jobid", ""))
    status = raw.get("status")
    if status == "Pass":
        if len(runs) == 1:
            return Job(job_id, submit, gpus, last, "pass")
        return Job(job_id, submit, gpus, last, "nondeterministic", fail_after=first)
    if status == "Killed":
        return Job(job_id, submit, gpus, last, "killed")
    if status == "Failed":
        return Job(job_id, submit, gpus, first, "deterministic", fail_after=first)
    return f"unknown status {status!r}"


def jobs_from_philly(entries: Iterable[Mapping[str, Any]]) -> PhillyTrace:
    """Convert trace entries; submit times are shifted so that the first job arrives at 0."""
    trace = PhillyTrace([])
    for raw in entries:
        got = _convert(raw)
        if isinstance(got, str):
            trace.skipped[got] += 1
        else:
            trace.jobs.append(got)
    if trace.jobs:
        t0 = min(j.submit for j in trace.jobs)
        trace.jobs = sorted((replace(j, submit=j.submit - t0) for j in trace.jobs),
                            key=lambda j: j.submit)
    return trace


def read_raw(path: str | Path) -> list[Mapping[str, Any]]:
    """The entries of a ``cluster_job_log`` file (the whole file is one JSON list)."""
    entries = orjson.loads(Path(path).read_bytes())
    if not isinstance(entries, list):
        raise ValueError(f"{path}: expected a JSON list of jobs (Philly cluster_job_log)")
    return entries


def read_philly(path: str | Path) -> PhillyTrace:
    """Read a ``cluster_job_log`` file into replayable jobs."""
    return jobs_from_philly(read_raw(path))


_LAST_STATE = {"Pass": "COMPLETED", "Killed": "CANCELLED", "Failed": "FAILED"}


def philly_job_events(entries: Iterable[Mapping[str, Any]]) -> Iterator[JobEvent]:
    """Started and finished events of every timed attempt, for the failure-rate estimator.

    The trace does not say why an attempt ended. By the same inference as
    :func:`jobs_from_philly`, a failed attempt of a job that later passed is blamed on the
    environment and ends ``NODE_FAIL``; that makes the resulting r_f an upper bound on node
    failures, since preemptions and transient software faults count too.
    """
    for raw in entries:
        attempts = raw.get("attempts") or []
        status = raw.get("status")
        job_id = str(raw.get("jobid", ""))
        for n, attempt in enumerate(attempts):
            start, end = _time(attempt.get("start_time")), _time(attempt.get("end_time"))
            if start is None or end is None:
                continue
            detail = attempt.get("detail") or []
            nodes = tuple(str(d.get("ip")) for d in detail if d.get("ip"))
            gpus = sum(len(d.get("gpus") or []) for d in detail)
            if n == len(attempts) - 1:
                state = _LAST_STATE.get(str(status), "FAILED")
            else:
                state = "NODE_FAIL" if status == "Pass" else "FAILED"
            yield JobEvent(job_id, n, "started", nodes=nodes, gpus=gpus, ts=start)
            yield JobEvent(job_id, n, "finished", state=state, nodes=nodes, gpus=gpus, ts=end)
