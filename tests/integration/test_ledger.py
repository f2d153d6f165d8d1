"""The decisions topic asked which attempts it already holds (streams/ledger.py), on a real
broker: answers stay right as the topic grows between questions, for questions that reach
back before what was read, and after the kept decisions were pruned."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path

import orjson
import pytest
from aiokafka import AIOKafkaProducer

from sibylla.settings import Settings
from sibylla.streams import ledger as ledger_module
from sibylla.streams.keys import attempt_key
from sibylla.streams.ledger import DecisionLedger
from sibylla.streams.reread import PartitionReader
from sibylla.streams.topics import ensure_topics
from tests.integration.fixtures import make_settings

pytestmark = pytest.mark.integration


async def _publish(settings: Settings, decisions: list[tuple[str, float]]) -> None:
    """Decisions (job id, stamped at) on partition 0 of the decisions topic, plus a record
    that is not a decision."""
    producer = AIOKafkaProducer(bootstrap_servers=settings.bootstrap_servers,
                                **settings.kafka_client_options())
    await producer.start()
    try:
        topic = settings.topic("decisions")
        for job_id, at in decisions:
            value = orjson.dumps({"job_id": job_id, "attempt": 0, "verdict": "deterministic"})
            await producer.send_and_wait(topic, value, key=job_id.encode(), partition=0,
                                         timestamp_ms=int(at * 1000))
        await producer.send_and_wait(topic, b"not json", partition=0,
                                     timestamp_ms=int(time.time() * 1000))
    finally:
        await producer.stop()


@contextlib.asynccontextmanager
async def _ledger(settings: Settings) -> AsyncIterator[DecisionLedger]:
    """A ledger of the decisions topic (created), with its reader closed afterwards."""
    await ensure_topics(settings)
    reader = PartitionReader(settings)
    try:
        yield DecisionLedger(reader, settings.topic("decisions"))
    finally:
        await reader.close()


def _asked(*job_ids: str, at: float) -> dict[str, float]:
    return {attempt_key(job_id, 0): at for job_id in job_ids}


def test_the_topic_tells_which_attempts_it_holds_as_it_grows(
        broker, unique_prefix: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    settings = make_settings(broker.bootstrap_servers, unique_prefix, tmp_path)
    monkeypatch.setattr(ledger_module, "KEEP_MAX", 4)

    async def scenario() -> None:
        now = time.time()
        async with _ledger(settings) as ledger:
            await _publish(settings, [("a", now - 60), ("b", now - 30)])
            found = await ledger.decided(0, _asked("a", "b", "c", at=now))
            assert set(found) == {attempt_key("a", 0), attempt_key("b", 0)}
            assert orjson.loads(found[attempt_key("a", 0)])["verdict"] == "deterministic"

            # Decisions published after the last question are found by the next one.
            await _publish(settings, [("c", now), ("d", now + 1)])
            found = await ledger.decided(0, _asked("c", "d", "e", at=now))
            assert set(found) == {attempt_key("c", 0), attempt_key("d", 0)}

            # A question about a termination long before: a decision stamped an hour ago
            # lies before what was read, and is found all the same.
            await _publish(settings, [("old", now - 3600), ("e", now + 2)])
            found = await ledger.decided(0, _asked("old", "e", at=now - 3500))
            assert set(found) == {attempt_key("old", 0), attempt_key("e", 0)}

            # More than KEEP_MAX kept: the older half is forgotten, and a question about one
            # of those reads the topic again rather than answer "not decided".
            await _publish(settings, [("f", now + 3), ("g", now + 4)])
            assert set(await ledger.decided(0, _asked("g", at=now))) == {attempt_key("g", 0)}
            found = await ledger.decided(0, _asked("a", "f", "z", at=now - 60))
            assert set(found) == {attempt_key("a", 0), attempt_key("f", 0)}

    asyncio.run(scenario())


def test_a_partition_read_ahead_answers_for_decisions_before_and_after(
        broker, unique_prefix: str, tmp_path: Path) -> None:
    # A worker reads a partition's decisions when it gets the partition (agents.py), before
    # any question; what is published later is still found.
    settings = make_settings(broker.bootstrap_servers, unique_prefix, tmp_path)

    async def scenario() -> None:
        now = time.time()
        async with _ledger(settings) as ledger:
            await _publish(settings, [("before", now - 10)])
            await ledger.warm(0, now - 240)
            await _publish(settings, [("after", now + 1)])
            found = await ledger.decided(0, _asked("before", "after", "never", at=now))
            assert set(found) == {attempt_key("before", 0), attempt_key("after", 0)}

    asyncio.run(scenario())
