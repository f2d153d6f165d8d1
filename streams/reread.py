"""Reading a stretch of a partition again, out of band, with a consumer of our own.

The agents sometimes need records their faust consumer will not give them: ranges it skipped
(:mod:`gaps`) and the decisions already on the decisions topic (:mod:`ledger`). The reads use
a consumer that joins no group and commits nothing, so it can neither move the group's offsets
nor wait on faust's consumer thread, and every read has a deadline.

The consumer is kept between reads. A fresh one's first offsets request waits out a metadata
retry (~100 ms on Apache Kafka, measured), and the decisions topic is read for every decide
batch while a partition is new to the worker: with a consumer per read, a lone failure's
decision paid that wait each time.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from aiokafka import AIOKafkaConsumer, TopicPartition

from sibylla.settings import Settings
from sibylla.streams.lag import start_consumer

__all__ = ["PartitionReader", "Record"]

log = logging.getLogger(__name__)

READ_TIMEOUT_S = 15.0


@dataclass(frozen=True, slots=True)
class Record:
    """One record read again: where it was and what it held."""

    offset: int
    key: bytes | None
    value: bytes | None
    timestamp: float  # seconds


async def _drain(consumer: AIOKafkaConsumer, tp: TopicPartition, start: int, end: int,
                 out: list[Record]) -> None:
    consumer.assign([tp])  # replaces the previous read's partition
    consumer.seek(tp, start)
    while await consumer.position(tp) < end:
        for r in (await consumer.getmany(tp, timeout_ms=500)).get(tp, []):
            if r.offset < end:
                out.append(Record(r.offset, r.key, r.value, r.timestamp / 1000.0))
    consumer.pause(tp)  # nothing fetched in the background until the next read


class PartitionReader:
    """Reads stretches of partitions, one at a time, with one consumer kept between reads (a
    read that fails or runs out of time replaces it: its state is unknown)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._consumer: AIOKafkaConsumer | None = None
        self._lock = asyncio.Lock()

    async def read_range(self, topic: str, partition: int, start: int, end: int,
                         timeout_s: float = READ_TIMEOUT_S) -> list[Record]:
        """Records ``start`` (inclusive) to ``end`` (exclusive) of a partition. Raises
        :class:`TimeoutError` when the broker does not give them within ``timeout_s``."""
        tp = TopicPartition(topic, partition)
        out: list[Record] = []

        async def read(consumer: AIOKafkaConsumer) -> None:
            await _drain(consumer, tp, start, end, out)
        await self._read(read, timeout_s)
        return out

    async def read_since(self, topic: str, partition: int, since_s: float,
                         timeout_s: float = READ_TIMEOUT_S) -> tuple[list[Record], int]:
        """The records of a partition whose timestamps are ``since_s`` or later, up to its end
        now (the first such record by the broker's time index, and everything after it), and
        that end: where a later :meth:`read_from` goes on. Raises :class:`TimeoutError` when
        the broker does not answer within ``timeout_s``."""
        tp = TopicPartition(topic, partition)

        async def first(consumer: AIOKafkaConsumer) -> int | None:
            found = (await consumer.offsets_for_times({tp: max(0, int(since_s * 1000))}))[tp]
            return None if found is None else found.offset
        return await self._to_end(tp, first, timeout_s)

    async def read_from(self, topic: str, partition: int, start: int,
                        timeout_s: float = READ_TIMEOUT_S) -> tuple[list[Record], int]:
        """The records of a partition from offset ``start`` to its end now, and that end.
        Raises :class:`TimeoutError` when the broker does not answer within ``timeout_s``."""
        async def first(consumer: AIOKafkaConsumer) -> int:
            return start
        return await self._to_end(TopicPartition(topic, partition), first, timeout_s)

    async def _to_end(self, tp: TopicPartition,
                      first: Callable[[AIOKafkaConsumer], Awaitable[int | None]],
                      timeout_s: float) -> tuple[list[Record], int]:
        """The records from offset ``first(consumer)`` (None: none) to the end now, and that
        end (never below the start)."""
        out: list[Record] = []
        end = 0

        async def read(consumer: AIOKafkaConsumer) -> None:
            nonlocal end
            start = await first(consumer)
            end = (await consumer.end_offsets([tp]))[tp]
            if start is not None:
                end = max(start, end)
                await _drain(consumer, tp, start, end, out)
        await self._read(read, timeout_s)
        return out, end

    async def _read(self, read: Callable[[AIOKafkaConsumer], Awaitable[None]],
                    timeout_s: float) -> None:
        async def locked() -> None:
            async with self._lock:
                try:
                    await read(await self._client())
                except BaseException:
                    await self.close()
                    raise
        await asyncio.wait_for(locked(), timeout_s)

    async def _client(self) -> AIOKafkaConsumer:
        if self._consumer is None:
            self._consumer = await start_consumer(self.settings, auto_offset_reset="earliest")
        return self._consumer

    async def close(self) -> None:
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            try:
                await consumer.stop()
            except Exception:  # noqa: BLE001 - a consumer being dropped: nothing to keep
                log.debug("stopping a reread consumer failed", exc_info=True)
