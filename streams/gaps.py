"""Records faust skipped, found and read again, so that none is lost across a rebalance.

A fault campaign (``bench/chaos.py``) found whole ranges of a partition neither processed nor
dead-lettered after rebalances: faust stops an isolated partition's actor by cancelling it,
and ``take_events`` (which the agents used then) acknowledged every event of the batch the
actor was working on (and the commit then moved past them) however the actor left. The
agents' batches (bulk.py) are acknowledged only once their work has ended, but also when it
failed, and faust's fetch loop drops records below its read offset after a seek. Windows
deduplicate replays by the highest offset applied, so such a hole could never be repaired
later.

So each agent that must not lose a record remembers, per partition and in a changelog-backed
table (it moves with the partition and survives a crash), the offset of the last record it
finished. A batch that starts past that offset + 1 is preceded by the records in between,
fetched from the broker with a consumer of our own; they go through the same code as any
other. A hole that really holds nothing (a transaction marker, records deleted by retention)
costs one fetch that returns nothing.

The marks are kept in memory as batches finish and written to the table before each offset
commit (:meth:`GapFiller.save`, from the commit hook): a successor needs them only as far as
the committed offsets, which it resumes from. Written per batch, they were 1.3-1.6 changelog
records per decided failure at 100 failures/s, a third of a failure's table writes. A mark
older than the commit (a worker killed between the two) makes a successor read the records in
between again; replays are deduplicated.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator, Sequence
from typing import Any

from sibylla.streams.bulk import Record, RecordEvent
from sibylla.streams.reread import PartitionReader
from sibylla.streams.state import live_get

__all__ = ["GapFiller"]

log = logging.getLogger(__name__)

STALL_S = 5.0  # no progress this long with records left: the consumer skipped them
STALL_FETCH_MAX = 5000  # records read again per stall at most (the rest on the next check)


class GapFiller:
    """Per (topic, partition): the last offset an agent finished, and the records it missed.

    ``table`` is a raw changelog-backed table; keys are ``"<topic>/<partition>"``, written in
    the event context of that partition so they live (and move) with it.
    """

    def __init__(self, reader: PartitionReader, table: Any) -> None:
        self.reader = reader
        self.table = table
        # (topic, partition) -> (last finished offset, since when) for stalled()
        self._progress: dict[tuple[str, int], tuple[int, float]] = {}
        # (topic, partition) -> batches of it an agent is working on (working())
        self._working: dict[tuple[str, int], int] = {}
        # partition -> {topic: last finished offset} not yet written to the table (save())
        self._unsaved: dict[int, dict[str, int]] = {}

    @staticmethod
    def _key(topic: str, partition: int) -> str:
        return f"{topic}/{partition}"

    def done(self, topic: str, partition: int) -> int | None:
        """The offset of the last record finished on this partition (None: none yet)."""
        unsaved = self._unsaved.get(partition)
        if unsaved is not None and topic in unsaved:
            return unsaved[topic]
        raw = live_get(self.table, self._key(topic, partition))
        return int(raw) if raw is not None else None

    def mark(self, events: Sequence[Any]) -> None:
        """Record the batch as finished, once whatever it sent is on the broker; the table
        gets it at the next :meth:`save`. (Never backwards: the agent and the stall check may
        finish overlapping batches.)"""
        last = events[-1].message
        done = self.done(last.topic, last.partition)
        if done is None or last.offset > done:
            self._unsaved.setdefault(last.partition, {})[last.topic] = last.offset

    def unsaved_partitions(self) -> list[int]:
        """The partitions with marks :meth:`save` has not written yet."""
        return list(self._unsaved)

    def save(self, partition: int) -> None:
        """Write the partition's marks to the table; call in the event context of the
        partition, before the offsets of the batches they mark are committed."""
        for topic, offset in self._unsaved.pop(partition, {}).items():
            self.table[self._key(topic, partition)] = str(offset).encode()

    def forget(self, partition: int) -> None:
        """Drop the partition's unwritten marks: revoked, it is no longer this worker's (the
        commit before a revocation wrote them)."""
        self._unsaved.pop(partition, None)

    @contextlib.contextmanager
    def working(self, topic: str, partition: int) -> Iterator[None]:
        """An agent works on a batch of the partition: it is not stalled meanwhile, however
        long the batch takes (a terminations batch waits for the decisions it makes, the
        model's first load at start), and its stall clock restarts when the batch ends.
        Counted as stalled, its records were read again and handled a second time beside
        the batch still working on them."""
        key = (topic, partition)
        self._working[key] = self._working.get(key, 0) + 1
        try:
            yield
        finally:
            self._working[key] -= 1
            if not self._working[key]:
                del self._working[key]
            self._progress.pop(key, None)

    def restart_clocks(self) -> None:
        """Forget how long each partition has gone without progress. For a worker that could
        not progress (its event loop was held, or its agents waited for the producer's buffer
        to drain), that time says nothing of skipped records; counted anyway, a commit that
        waited 10 s on a slow broker had every partition's queued records read again, on a
        worker already behind (a benchmark run on Apache Kafka, docs/pipeline-bench.md)."""
        self._progress.clear()

    async def stalled(self, topic: str, partition: int, end: int) -> list[Any]:
        """The records between the last finished one and the partition's ``end`` when the
        agent has made no progress for :data:`STALL_S` while some are left: records faust
        fetched past and never delivered, at the end of a partition, where no later record
        would reveal the hole. Empty otherwise, and while an agent works on a batch of the
        partition (:meth:`working`)."""
        key = (topic, partition)
        if key in self._working:
            return []
        done = self.done(topic, partition)
        if done is None or end <= done + 1:
            self._progress.pop(key, None)
            return []
        now = time.monotonic()
        seen = self._progress.get(key)
        if seen is None or seen[0] != done:
            self._progress[key] = (done, now)
            return []
        if now - seen[1] < STALL_S:
            return []
        del self._progress[key]
        missing = await self._fetch(topic, partition, done + 1,
                                    min(end, done + 1 + STALL_FETCH_MAX))
        log.warning("%s[%d]: no progress past offset %d for %.0f s though the partition "
                    "ends at %d; %d records read again", topic, partition, done, STALL_S,
                    end, len(missing))
        return missing

    async def with_missing(self, events: Sequence[Any]) -> Sequence[Any]:
        """``events`` with the records the consumer skipped put back in place: those between
        the last finished offset and the batch, and any hole inside the batch (faust's fetch
        loop silently drops records below its read offset after a seek)."""
        first = events[0].message
        topic, partition = first.topic, first.partition
        done = self.done(topic, partition)
        expected = first.offset if done is None else done + 1
        out: list[Any] = []
        for event in events:
            offset = event.message.offset
            if offset > expected:
                missing = await self._fetch(topic, partition, expected, offset)
                log.warning("%s[%d]: offsets %d..%d were skipped by the consumer; %d records "
                            "read again", topic, partition, expected, offset - 1, len(missing))
                out.extend(missing)
            out.append(event)
            expected = max(expected, offset + 1)  # a replay may go back: no hole there
        return out

    async def _fetch(self, topic: str, partition: int, start: int, end: int
                     ) -> list[RecordEvent]:
        """Records ``start`` (inclusive) to ``end`` (exclusive) of a partition, as events."""
        records = await self.reader.read_range(topic, partition, start, end)
        return [RecordEvent(Record(topic, partition, r.offset, r.key, r.value, r.timestamp))
                for r in records]
