"""Prometheus metrics of ``sibylla slurm actuator``: whether decisions reach Slurm.

A decision that the worker published but the actuator never applied is a failed job left to
the site's blind default, with nothing in the worker's metrics to show it. These tell an
operator that the actuator keeps up (lag), that slurmctld answers it (the wait), and what it
did with each decision (outcomes: a ``failed`` one left a job unhandled).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import get_args

from prometheus_client import CollectorRegistry, Counter, Gauge

from sibylla.schemas.records import Action

__all__ = ["OUTCOMES", "ActuatorMetrics"]

OUTCOMES = ("applied", "skipped", "dry-run", "failed")


class ActuatorMetrics:
    """Every metric the actuator exports, on a registry of its own."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = r = registry or CollectorRegistry()
        self.decisions = Counter("sibylla_actuator_decisions", "Decisions handled, by action "
                                 "and outcome (applied, skipped, dry-run, failed: scontrol "
                                 "refused it three times and the job was left as it was).",
                                 ["action", "outcome"], registry=r)
        # Every series from the start, at 0: an alert over increases sees a quiet actuator.
        for action in get_args(Action):
            for outcome in OUTCOMES:
                self.decisions.labels(action=action, outcome=outcome)
        self.lag = Gauge("sibylla_actuator_lag", "Decisions on the topic not yet handled (the "
                         "one in hand included), per partition; measured every second.",
                         ["partition"], registry=r)
        self._lagging: set[int] = set()
        self.waiting_since: float | None = None  # monotonic; set while slurmctld is silent
        wait = Gauge("sibylla_actuator_controller_wait_seconds", "How long the decision in "
                     "hand has waited for slurmctld to answer (0: not waiting).", registry=r)
        wait.set_function(self._waited)
        self.last_handled = Gauge("sibylla_actuator_last_decision_timestamp_seconds",
                                  "When the actuator last handled a decision (Unix time).",
                                  registry=r)

    def _waited(self) -> float:
        since = self.waiting_since
        return 0.0 if since is None else time.monotonic() - since

    def set_lag(self, lags: Mapping[int, int]) -> None:
        """The lag of the partitions owned now; those owned no more are dropped (another
        actuator of the group reports them, and a stale value would count twice)."""
        for partition in self._lagging - lags.keys():
            self.lag.remove(str(partition))
        for partition, lag in lags.items():
            self.lag.labels(partition=str(partition)).set(lag)
        self._lagging = set(lags)

    def handled(self, action: str, outcome: str) -> None:
        self.decisions.labels(action=action, outcome=outcome).inc()
        self.last_handled.set(time.time())
