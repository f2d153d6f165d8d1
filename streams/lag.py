"""Consumer lag per partition, as an operator sees it: end offset minus committed offset.

Measured from outside the worker's own consumer (a consumer of the group's id that never
subscribes, so it never joins the group nor commits), so it counts what the group has
committed, which is what a restart resumes from. (An admin client's group-offsets request is
not understood by every Kafka-compatible broker; the consumer's offset fetch is.)
"""

from __future__ import annotations

from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition

from sibylla.settings import Settings

__all__ = ["LagProbe"]


class LagProbe:
    """Reads the lag of one consumer group on a set of topics."""

    def __init__(self, settings: Settings, topics: list[str]) -> None:
        self.settings = settings
        self.topics = topics
        self._consumer: AIOKafkaConsumer | None = None

    async def _client(self) -> AIOKafkaConsumer:
        if self._consumer is None:
            opts: dict[str, Any] = self.settings.kafka_client_options()
            self._consumer = AIOKafkaConsumer(
                bootstrap_servers=self.settings.bootstrap_servers,
                group_id=self.settings.group_id, enable_auto_commit=False, **opts)
            await self._consumer.start()
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

    async def close(self) -> None:
        if self._consumer is not None:
            await self._consumer.stop()
        self._consumer = None
