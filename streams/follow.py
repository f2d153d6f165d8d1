"""Reading a Sibylla topic as its users do: the decisions (a scheduler), the labels and the
model announcements (the demo, an operator's script)."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Callable
from typing import TypeVar

from aiokafka import AIOKafkaConsumer

from sibylla.schemas.records import Decision
from sibylla.settings import Settings

__all__ = ["follow", "follow_decisions", "print_decisions"]

R = TypeVar("R")


def follow_decisions(settings: Settings, from_beginning: bool = True,
                     idle_timeout_s: float | None = None) -> AsyncIterator[Decision]:
    """Decisions as they are published; stops after ``idle_timeout_s`` without one."""
    return follow(settings, "decisions", Decision.from_json, from_beginning, idle_timeout_s)


async def follow(settings: Settings, topic: str, parse: Callable[[bytes], R],
                 from_beginning: bool = True, idle_timeout_s: float | None = None
                 ) -> AsyncIterator[R]:
    """The records of ``settings.topic(topic)`` parsed, as they are published (no consumer
    group: nothing is committed); stops after ``idle_timeout_s`` without one."""
    consumer = AIOKafkaConsumer(
        settings.topic(topic), bootstrap_servers=settings.bootstrap_servers,
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
                    yield parse(record.value)
    finally:
        await consumer.stop()


async def print_decisions(settings: Settings, keep_following: bool, from_beginning: bool
                          ) -> int:
    """``sibylla decisions``: JSON lines on stdout; without --follow, what exists now."""
    idle = None if keep_following else 2.0
    async for decision in follow_decisions(settings, from_beginning or not keep_following,
                                           idle):
        sys.stdout.buffer.write(decision.to_json() + b"\n")
        sys.stdout.flush()
    return 0
