"""The policy with memory: decisions that know the job's earlier attempts.

Per job, a bounded history of its failed attempts (root fingerprint, progress, nodes, blamed
nodes, the action taken) lives in the ``history`` table, keyed by job_id and partitioned like
the job topics, so the worker deciding an attempt holds the job's whole history. The rules are
in :func:`sibylla.streams.policy.apply_memory`; this module only reads and writes the table.

Replays are idempotent: an attempt's entry replaces any earlier entry of the same attempt, so a
decision made again after a crash sees the same history as the first time.
"""

from __future__ import annotations

import time
from typing import Any

import orjson

from sibylla.inference.api import LogWindow, Prediction
from sibylla.schemas.records import Decision, JobEvent
from sibylla.settings import Settings
from sibylla.streams.attempts import AttemptFacts, facts_of
from sibylla.streams.keys import partition_of
from sibylla.streams.metrics import WorkerMetrics
from sibylla.streams.policy import BLAMING_RULES, Rules, apply_memory, make_decision
from sibylla.streams.reading import WindowReading
from sibylla.streams.state import live_get

__all__ = ["AttemptMemory", "rules_of"]


def rules_of(settings: Settings) -> Rules:
    """The policy's rules from the ``policy_*`` settings."""
    return Rules(max_retries=settings.policy_max_retries,
                 max_recurrence=settings.policy_max_recurrence,
                 max_recurrence_transient=settings.policy_max_recurrence_transient,
                 max_excluded_nodes=settings.policy_max_excluded_nodes)


class AttemptMemory:
    """Decides failed attempts with the job's history and remembers each one.

    Must be called in the job's partition's context (``Pipeline.in_partition``): the table
    write lands on the partition of the current event.
    """

    def __init__(self, table: Any, settings: Settings, metrics: WorkerMetrics) -> None:
        self.table = table
        self.settings = settings
        self.rules = rules_of(settings)
        self.metrics = metrics

    def history(self, job_id: str) -> list[AttemptFacts]:
        raw = live_get(self.table, job_id)
        if raw is None:
            return []
        return [AttemptFacts.from_dict(a) for a in orjson.loads(raw)["attempts"]]

    def decide(self, job: JobEvent, window: LogWindow, prediction: Prediction | None,
               reading: WindowReading, model_version: str, decided_at: float,
               event_time: float) -> Decision:
        """The decision for a failed attempt, revised by the job's history (recorded).
        ``reading``: what the window's text says beyond the prediction (reading.py)."""
        s = self.settings
        first = make_decision(job, window, prediction, model_version, decided_at, event_time,
                              explore_rate=s.explore_rate,
                              explore_max_confidence=s.explore_max_confidence,
                              min_retry_confidence=s.min_retry_confidence)
        facts = facts_of(job.attempt, reading, first.category, job.nodes, job.state)
        history = self.history(job.job_id)
        decision, remembered = apply_memory(first, facts, history, self.rules)
        kept = [h for h in history if h.attempt != job.attempt] + [remembered]
        kept = sorted(kept, key=lambda h: h.attempt)[-s.policy_history_max:]
        self.table[job.job_id] = orjson.dumps(
            {"updated_at": time.time(), "attempts": [h.to_dict() for h in kept]})
        for node in decision.avoid_nodes if decision.rule in BLAMING_RULES else ():
            self.metrics.node_blames.labels(node=node).inc()
        return decision

    def expire(self, partition: int, horizon: float) -> None:
        """Forget histories of jobs with no failure since ``horizon`` (epoch seconds)."""
        partitions = self.settings.partitions
        for raw_key in list(self.table.keys()):
            job_id = raw_key.decode() if isinstance(raw_key, bytes) else raw_key
            if partition_of(job_id, partitions) != partition:
                continue
            value = live_get(self.table, job_id)
            if value is not None and orjson.loads(value)["updated_at"] < horizon:
                del self.table[job_id]
