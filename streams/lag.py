"""Consumer lag per partition, as an operator sees it: end offset minus committed offset.

Measured from outside the worker's own consumer (a consumer of the group's id that never
subscribes, so it never joins the group nor commits), so it counts what the group has
committed, which is what a restart resumes from. (An admin client's group-offsets request is
not understood by every Kafka-compatible broker; the consumer's offset fetch is.)

The agents ask it too, for a partition's end offset and the group's committed offset, rather
than faust's consumer: faust runs those requests on its consumer thread's method queue, where
one was seen to hang for minutes after a restart, stalling the agent that awaited it and every
job behind it on that partition. Here each question has a deadline, and no answer is an answer
(None) the caller knows how to live with.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Coroutine, Sequence
from typing import Any, TypeVar

from aiokafka import AIOKafkaConsumer, TopicPartition

from sibylla.settings import Settings

__all__ = ["LagProbe", "start_consumer"]

log = logging.getLogger(__name__)

T = TypeVar("T")

ASK_TIMEOUT_S = 2.0


async def start_consumer(settings: Settings, **options: Any) -> AIOKafkaConsumer:
    """A started consumer of the settings' brokers that commits nothing (stopped again when
    its start fails or is cancelled, so that no connection is left behind)."""
    consumer = AIOKafkaConsumer(bootstrap_servers=settings.bootstrap_servers,
                                enable_auto_commit=False, **settings.kafka_client_options(),
                                **options)
    try:
        await consumer.start()
    except BaseException:
        await consumer.stop()
        raise
    return consumer


class LagProbe:
    """One consumer group's offsets seen from outside its consumer: the lag on a set of
    topics for operators, a partition's end and committed offsets for the agents."""

    def __init__(self, settings: Settings, topics: list[str]) -> None:
        self.settings = settings
        self.topics = topics
        self._consumer: AIOKafkaConsumer | None = None
        self._starting = asyncio.Lock()  # the lag timer and the agents ask concurrently

    async def _client(self) -> AIOKafkaConsumer:
        async with self._starting:
            if self._consumer is None:  # a failed or timed-out start: the next ask retries
                self._consumer = await start_consumer(self.settings,
                                                      group_id=self.settings.group_id)
            return self._consumer

    async def lag(self) -> dict[tuple[str, int], int]:
        consumer = await self._client()
        tps = [TopicPartition(t, p) for t in self.topics
               for p in sorted(consumer.partitions_for_topic(t) or ())]
        if not tps:
            await consumer._client.force_metadata_update()  # topics created after start
            return {}
        ends = await consumer.end_offsets(tps)
        out: dict[tuple[str, int], int] = {}
        for tp in tps:
            done = await consumer.committed(tp) or 0
            out[(tp.topic, tp.partition)] = max(0, ends[tp] - done)
        return out

    async def all_committed(self, timeout_s: float, poll_s: float = 0.05) -> bool:
        """Whether the group has committed every record of the topics, asked every
        ``poll_s`` until ``timeout_s`` pass: a commit comes after what the records caused was
        saved (the windows, agents.py), so whoever reads that state waits for this."""
        deadline = time.monotonic() + timeout_s
        while True:
            lags = await self.lag()
            if lags and not any(lags.values()):
                return True
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(poll_s)

    async def end_offset(self, topic: str, partition: int) -> int | None:
        """The partition's end offset (one past its last record), or None when the broker
        does not answer within :data:`ASK_TIMEOUT_S`."""
        ends = await self.end_offsets(topic, [partition])
        return None if ends is None else ends[partition]

    async def end_offsets(self, topic: str, partitions: Sequence[int]
                          ) -> dict[int, int] | None:
        """The end offset of each of the topic's ``partitions``, asked in one request; None
        when the broker does not answer within :data:`ASK_TIMEOUT_S`."""
        tps = [TopicPartition(topic, partition) for partition in partitions]

        async def ask() -> dict[int, int]:
            ends = await (await self._client()).end_offsets(tps)
            return {tp.partition: int(ends[tp]) for tp in tps}
        return await self._answer(ask(), f"end offsets of {topic}{sorted(partitions)}")

    async def committed_offset(self, topic: str, partition: int) -> int | None:
        """The group's committed offset of the partition (0 when none), or None when the
        broker does not answer within :data:`ASK_TIMEOUT_S`."""
        async def ask() -> int:
            consumer = await self._client()
            return int(await consumer.committed(TopicPartition(topic, partition)) or 0)
        return await self._answer(ask(), f"committed offset of {topic}[{partition}]")

    @staticmethod
    async def _answer(question: Coroutine[Any, Any, T], what: str) -> T | None:
        try:
            return await asyncio.wait_for(question, ASK_TIMEOUT_S)
        except Exception as exc:  # noqa: BLE001 - a timeout or a broker error: no answer
            log.warning("no %s: %r", what, exc)
            return None

    async def close(self) -> None:
        if self._consumer is not None:
            await self._consumer.stop()
        self._consumer = None
