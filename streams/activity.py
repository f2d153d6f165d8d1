"""What a worker remembers for its status page and Prometheus does not keep.

The last decisions with their evidence, the last dead letters, decisions per action for each
minute of the last hour, the nodes retries were sent away from, the lag last measured and the
gate scores of the model in use. Everything is bounded (rings and 60 one-minute buckets), so a
busy worker pays a constant amount of memory for it, and it is lost on restart: it is a view
of this process, not a record (the topics are the record).
"""

from __future__ import annotations

import time
from collections import Counter, deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sibylla.schemas.records import Decision

__all__ = ["Activity", "DeadLetterNote"]

RECENT_DECISIONS = 20
RECENT_DEAD_LETTERS = 10
MINUTES = 60  # the window of the per-action and suspect-node counts
TOP_SUSPECTS = 10


@dataclass(frozen=True, slots=True)
class DeadLetterNote:
    """One record sent to the dead-letter topic, as the status page lists it."""

    at: float
    topic: str
    kind: str
    reason: str


@dataclass
class _Minute:
    actions: Counter[str] = field(default_factory=Counter)
    nodes: Counter[str] = field(default_factory=Counter)


class Activity:
    """Recent decisions, dead letters, lag and model of one worker (see the module doc)."""

    def __init__(self, model_version: str = "") -> None:
        self.decisions: deque[Decision] = deque(maxlen=RECENT_DECISIONS)
        self.dead_letters: deque[DeadLetterNote] = deque(maxlen=RECENT_DEAD_LETTERS)
        self.dead_letters_by_kind: Counter[str] = Counter()
        self.lag: dict[tuple[str, int], int] = {}
        self.lag_at: float | None = None
        self.model_version = model_version
        self.model_device = ""  # where it runs: cpu or cuda ("" until loaded)
        self.model_scores: Mapping[str, Any] = {}
        self._minutes: dict[int, _Minute] = {}

    def set_model(self, version: str, device: str,
                  scores: Mapping[str, Any] | None = None) -> None:
        """The model now deciding, where it runs, and its gate scores when it came from an
        announcement."""
        self.model_version = version
        self.model_device = device
        self.model_scores = dict(scores or {})

    def set_scores(self, scores: Mapping[str, Any]) -> None:
        """The deciding model's gate scores, once its announcement is read (a worker that
        loaded it at start learns them then)."""
        self.model_scores = dict(scores)

    def set_lag(self, lag: Mapping[tuple[str, int], int], now: float | None = None) -> None:
        self.lag = dict(lag)
        self.lag_at = time.time() if now is None else now

    def on_decision(self, decision: Decision) -> None:
        self.decisions.append(decision)
        minute = self._minute(decision.decided_at)
        minute.actions[decision.action] += 1
        minute.nodes.update(decision.avoid_nodes)

    def on_dead_letter(self, note: DeadLetterNote) -> None:
        self.dead_letters.append(note)
        self.dead_letters_by_kind[note.kind] += 1

    def actions_per_minute(self, now: float) -> dict[str, list[int]]:
        """Per action, decisions in each of the last :data:`MINUTES` minutes, oldest first."""
        last = int(now // 60)
        first = last - MINUTES + 1
        out: dict[str, list[int]] = {}
        for index, bucket in self._minutes.items():
            if index < first or index > last:
                continue
            for action, count in bucket.actions.items():
                out.setdefault(action, [0] * MINUTES)[index - first] += count
        return dict(sorted(out.items()))

    def suspect_nodes(self, now: float) -> list[tuple[str, int]]:
        """Nodes that decisions of the last hour sent retries away from, most named first."""
        first = int(now // 60) - MINUTES + 1
        total: Counter[str] = Counter()
        for index, bucket in self._minutes.items():
            if index >= first:
                total.update(bucket.nodes)
        return total.most_common(TOP_SUSPECTS)

    def _minute(self, at: float) -> _Minute:
        index = int(at // 60)
        bucket = self._minutes.get(index)
        if bucket is None:
            bucket = self._minutes[index] = _Minute()
            for old in [i for i in self._minutes if i <= index - MINUTES]:
                del self._minutes[old]
        return bucket
