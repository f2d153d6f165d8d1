"""Is this worker ready: does it own partitions, with their tables recovered?

A worker that has just started (or is in a rebalance) has no partitions yet, or is replaying
their changelogs into its tables; decisions asked of it then wait, and a load balancer or an
orchestrator should not count it as serving. ``GET /ready`` and the ``sibylla_worker_ready``
gauge answer from :meth:`Readiness.state`.

Faust has no public "ready" flag, so this reads the pieces it exposes (faust-streaming 0.15):
``app.rebalancing_count`` grows when a rebalance starts (the aiokafka driver's
``on_partitions_revoked``), the ``app.on_rebalance_complete`` signal is sent once the table
recovery that follows it has finished (or was not needed), ``app.in_recovery`` is true while
changelogs are replayed, ``app.tables.recovery.completed`` is set after the first recovery,
and ``app.assignor.assigned_actives()`` holds the partitions this worker owns. Ready means:
the model is loaded (it loads while the worker joins its group), the latest rebalance has
completed its recovery, and at least one partition of the logs topic is assigned here. The
test of ``/ready`` against a real broker fails if faust changes these.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["ReadyState", "Readiness"]


@dataclass(frozen=True, slots=True)
class ReadyState:
    """The answer of ``GET /ready`` (its JSON body)."""

    ready: bool
    reason: str
    partitions: list[int]
    ready_after_s: float | None  # from process start to the first time it was ready

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class Readiness:
    """Readiness of the worker running ``app``, for the partitions of ``topic``, once
    ``model_loaded()``."""

    def __init__(self, app: Any, topic: str, model_loaded: Callable[[], bool]) -> None:
        self.app = app
        self.topic = topic
        self.model_loaded = model_loaded
        self._started = time.monotonic()
        self._completed_rebalance = -1  # rebalancing_count when recovery last completed
        self.ready_after_s: float | None = None
        app.on_rebalance_complete.connect(self._on_rebalance_complete)

    async def _on_rebalance_complete(self, sender: Any, **_: Any) -> None:
        self._completed_rebalance = self.app.rebalancing_count
        self.time_if_ready()

    def time_if_ready(self) -> None:
        """Record when the worker first became ready, if it now is. Called when something
        readiness waits for arrives (a rebalance completed, the model loaded), not left to the
        first question: nobody may ask until the next scrape."""
        if self.ready_after_s is None and self._check()[0]:
            self._time_ready()

    def _time_ready(self) -> None:
        self.ready_after_s = round(time.monotonic() - self._started, 3)

    def _partitions(self) -> list[int]:
        return sorted(tp.partition for tp in self.app.assignor.assigned_actives()
                      if tp.topic == self.topic)

    def state(self) -> ReadyState:
        ready, reason, partitions = self._check()
        if ready and self.ready_after_s is None:  # ready by nothing that was announced
            self._time_ready()
        return ReadyState(ready, reason, partitions, self.ready_after_s)

    def _check(self) -> tuple[bool, str, list[int]]:
        app = self.app
        if app.rebalancing_count == 0:
            return False, "waiting for the first partition assignment", []
        if app.rebalancing or self._completed_rebalance != app.rebalancing_count:
            return False, "rebalancing: partitions are being assigned", []
        if app.in_recovery or not app.tables.recovery.completed.is_set():
            return False, "recovering tables from their changelogs", []
        partitions = self._partitions()
        if not partitions:
            return False, "no partitions assigned (more workers than partitions?)", []
        if not self.model_loaded():
            return False, "loading the model", []
        return True, f"serving {len(partitions)} partition(s)", partitions
