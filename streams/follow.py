"""Reading the decisions topic, as a scheduler does."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator

from aiokafka import AIOKafkaConsumer

from sibylla.schemas.records import Decision
from sibylla.settings import Settings

__all__ = ["follow_decisions", "print_decisions"]


async def follow_decisions(settings: Settings, from_beginning: bool = True,
                           idle_timeout_s: float | None = None) -> AsyncIterator[Decision]:
    """Decisions as they are published; stops after ``idle_timeout_s`` without one."""
    consumer = AIOKafkaConsumer(
        settings.topic("decisions"), bootstrap_servers=settings.bootstrap_servers,
        auto_offset_reset="earliest" if from_beginning else "latest",
        enable_auto_commit=False, **settings.kafka_client_options())
    await consumer.start()
    try:
        while True:
            batch = await consumer.getmany(
                timeout_ms=int((idle_timeout_s if idle_timeout_s is not None else 1.0) * 1000))
            if not batch and idle_timeout_s is not None:
                return
            for records in batch.values():
                for record in records:
                    yield Decision.from_json(record.value)
    finally:
        await consumer.stop()


async def print_decisions(settings: Settings, follow: bool, from_beginning: bool) -> int:
    """``sibylla decisions``: JSON lines on stdout; without --follow, what exists now."""
    idle = None if follow else 2.0
    async for decision in follow_decisions(settings, from_beginning or not follow, idle):
        sys.stdout.buffer.write(decision.to_json() + b"\n")
        sys.stdout.flush()
    return 0
