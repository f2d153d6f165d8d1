"""Prometheus metrics of a worker, on its own registry (served at /metrics)."""

from __future__ import annotations

import os

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

__all__ = ["WorkerMetrics"]

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


class WorkerMetrics:
    """Every metric a worker exports. One instance per worker process."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.lines = Counter("sibylla_log_lines_ingested", "Log lines accepted.", registry=r)
        self.bytes = Counter("sibylla_log_bytes_ingested", "Log record bytes accepted.",
                             registry=r)
        self.records = Counter("sibylla_log_records_ingested", "Log records (LogLine or "
                               "LogBatch) accepted.", registry=r)
        self.late_lines = Counter("sibylla_late_log_lines_dropped",
                                  "Lines for attempts already decided.", registry=r)
        self.rekeyed = Counter("sibylla_log_records_rekeyed",
                               "Log records whose Kafka key was not their job_id, re-published "
                               "under it.", registry=r)
        self.dead_letters = Counter("sibylla_dead_letters", "Records sent to the dead-letter "
                                    "topic, by source topic and reason class.",
                                    ["topic", "reason"], registry=r)
        self.refetched = Counter("sibylla_records_refetched",
                                 "Records the consumer skipped (a rebalance cut a batch), read "
                                 "again from the broker.", ["topic"], registry=r)
        self.adopted_decisions = Counter(
            "sibylla_decisions_adopted", "Decisions found on the decisions topic but missing "
            "from the local decided table (stale state after a restart or hand-over), adopted "
            "instead of being made again.", registry=r)
        self.active_windows = Gauge("sibylla_active_windows", "Job attempt windows held.",
                                    registry=r)
        self.window_bytes = Gauge("sibylla_window_bytes", "Log text held in windows.",
                                  registry=r)
        self.expired_windows = Counter("sibylla_windows_expired",
                                       "Windows dropped after the idle TTL.", registry=r)
        self.job_events = Counter("sibylla_job_events", "Job events by event and state.",
                                  ["event", "state"], registry=r)
        self.decisions = Counter("sibylla_decisions", "Decisions published, by verdict.",
                                 ["verdict", "action"], registry=r)
        self.explored = Counter("sibylla_decisions_explored",
                                "Deterministic verdicts sent as default_policy (exploration).",
                                registry=r)
        self.decision_latency = Histogram("sibylla_decision_latency_seconds",
                                          "From the termination event to its decision.",
                                          buckets=_LATENCY_BUCKETS, registry=r)
        # Where a decision's time goes: an operator can tell a worker behind its input
        # (waiting) from a slow model (classifying) and a slow broker (publishing).
        stages = Histogram("sibylla_decision_stage_seconds",
                           "A decision's latency by stage: waiting (from the termination event "
                           "until its decision is taken up: grace period, the wait for its log, "
                           "work queued ahead), classifying (micro-batch and model), "
                           "publishing (until the broker acknowledged it).",
                           ["stage"], buckets=_LATENCY_BUCKETS, registry=r)
        self.waiting = stages.labels(stage="waiting")
        self.classifying = stages.labels(stage="classifying")
        self.publishing = stages.labels(stage="publishing")
        self.batch_size = Histogram("sibylla_inference_batch_size", "Windows per micro-batch.",
                                    buckets=_BATCH_BUCKETS, registry=r)
        self.batch_latency = Histogram("sibylla_inference_batch_seconds",
                                       "Model time per micro-batch.",
                                       buckets=_LATENCY_BUCKETS, registry=r)
        self.consumer_lag = Gauge("sibylla_consumer_lag", "Records not yet committed by the "
                                  "group: end offset minus committed offset.",
                                  ["topic", "partition"], registry=r)
        self.worker_info = Gauge("sibylla_worker_info", "This worker process (value 1).",
                                 ["pid"], registry=r)
        self.worker_info.labels(pid=str(os.getpid())).set(1)
        self.model_info = Gauge("sibylla_model_info", "The model making decisions (value 1) "
                                "and where it runs (device: cpu or cuda).",
                                ["version", "device"], registry=r)
        self.failure_rate = Gauge("sibylla_node_failure_rate_per_node_day",
                                  "Estimated infrastructure failures per node-day (r_f).",
                                  registry=r)
        self.node_blames = Counter("sibylla_node_blames",
                                   "Failed attempts whose evidence (Xid/ECC lines, node "
                                   "failure) blamed a node: a node high here across many jobs "
                                   "is a suspect (sibylla nodes lists them).",
                                   ["node"], registry=r)
        self.mttf_seconds = Gauge("sibylla_mttf_seconds",
                                  "Projected mean time to failure, by job size in nodes.",
                                  ["nodes"], registry=r)
        self.ready = Gauge("sibylla_worker_ready", "1 when this worker owns partitions with "
                           "their tables recovered (GET /ready), else 0.", registry=r)

    def on_batch(self, size: int, seconds: float) -> None:
        self.batch_size.observe(size)
        self.batch_latency.observe(seconds)

    def set_model(self, version: str, device: str) -> None:
        self.model_info.clear()
        self.model_info.labels(version=version, device=device).set(1)
