"""Reading a stretch of a partition again, out of band, with a consumer of our own.

The agents sometimes need records their faust consumer will not give them: ranges it skipped
(:mod:`gaps`) and the decisions already on the decisions topic (:mod:`ledger`). Each read uses
a short-lived consumer that joins no group and commits nothing, so it can neither move the
group's offsets nor wait on faust's consumer thread, and every read has a deadline.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from aiokafka import AIOKafkaConsumer, TopicPartition

from sibylla.settings import Settings

__all__ = ["Record", "read_range", "read_since"]

READ_TIMEOUT_S = 15.0


@dataclass(frozen=True, slots=True)
class Record:
    """One record read again: where it was and what it held."""

    offset: int
    key: bytes | None
    value: bytes | None
    timestamp: float  # seconds


def _consumer(settings: Settings) -> AIOKafkaConsumer:
    return AIOKafkaConsumer(bootstrap_servers=settings.bootstrap_servers,
                            enable_auto_commit=False, auto_offset_reset="earliest",
                            **settings.kafka_client_options())


async def _drain(consumer: AIOKafkaConsumer, tp: TopicPartition, start: int, end: int,
                 out: list[Record]) -> None:
    consumer.assign([tp])
    consumer.seek(tp, start)
    while await consumer.position(tp) < end:
        for r in (await consumer.getmany(tp, timeout_ms=500)).get(tp, []):
            if r.offset < end:
                out.append(Record(r.offset, r.key, r.value, r.timestamp / 1000.0))


async def read_range(settings: Settings, topic: str, partition: int, start: int, end: int,
                     timeout_s: float = READ_TIMEOUT_S) -> list[Record]:
    """Records ``start`` (inclusive) to ``end`` (exclusive) of a partition. Raises
    :class:`TimeoutError` when the broker does not give them within ``timeout_s``."""
    consumer = _consumer(settings)
    out: list[Record] = []
    await consumer.start()
    try:
        await asyncio.wait_for(_drain(consumer, TopicPartition(topic, partition), start, end,
                                      out), timeout_s)
    finally:
        await consumer.stop()
    return out


async def read_since(settings: Settings, topic: str, partition: int, since_s: float,
                     timeout_s: float = READ_TIMEOUT_S) -> list[Record]:
    """The records of a partition whose timestamps are ``since_s`` or later, up to its end
    now (the first such record by the broker's time index, and everything after it).
    Raises :class:`TimeoutError` when the broker does not answer within ``timeout_s``."""
    consumer = _consumer(settings)
    tp = TopicPartition(topic, partition)
    out: list[Record] = []

    async def read() -> None:
        found = (await consumer.offsets_for_times({tp: max(0, int(since_s * 1000))}))[tp]
        end = (await consumer.end_offsets([tp]))[tp]
        if found is not None:
            await _drain(consumer, tp, found.offset, end, out)
    await consumer.start()
    try:
        await asyncio.wait_for(read(), timeout_s)
    finally:
        await consumer.stop()
    return out
