"""Records taken in batches from faust's queue, worked on to the end, then acknowledged."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import faust
import pytest
from aiokafka.structs import ConsumerRecord
from faust.types import TP, Message
from faust.types.tuples import ConsumerMessage

from sibylla.streams.bulk import BulkMessage, BulkTopic, acked, batches, consume, finish

TOPIC = "sibylla.logs"
PARTITION = TP(TOPIC, 0)


def _record(offset: int) -> ConsumerRecord[bytes, bytes]:
    """A record as aiokafka's fetcher returns it (timestamp in milliseconds)."""
    return ConsumerRecord(TOPIC, 0, offset, 1_700_000_000_000 + offset, 0, b"job", b"{}", None,
                          3, 2, [])


def _fetched(*offsets: int) -> BulkMessage:
    """What the consumer hands the conductor for one fetch of the partition."""
    return BulkMessage(PARTITION, [_record(o) for o in offsets], offsets[0], generation_id=1)


class _Consumer:
    """What faust's consumer does when a message is finally acknowledged: note its offset."""

    def __init__(self) -> None:
        self.acked: list[int] = []

    def ack(self, message: Message) -> bool:
        self.acked.append(message.offset)
        return True


@pytest.fixture
def app() -> faust.App:
    return faust.App("bulk-test", broker="kafka://127.0.0.1:1")


def _partition_stream(app: faust.App) -> Any:
    """What faust hands the agent of one isolated partition: a stream over its channel."""
    topic = BulkTopic(app, topics=[TOPIC], key_serializer="raw", value_serializer="raw")
    return SimpleNamespace(channel=topic.clone(active_partitions={PARTITION}))


def test_a_fetch_becomes_one_message_whose_records_the_agents_read() -> None:
    message = _fetched(5, 6, 8)
    assert message.offset == 8 and message.tp == PARTITION
    assert [e.message.offset for e in message.events] == [5, 6, 8]
    record = message.events[0].message
    assert (record.topic, record.partition, record.key, record.value) == (TOPIC, 0, b"job",
                                                                          b"{}")
    assert record.timestamp == pytest.approx(1_700_000_000.005)  # seconds, as faust's


async def test_the_conductor_queues_the_fetch_as_it_is_and_refuses_a_single_record(
        app: faust.App) -> None:
    channel = aiter(_partition_stream(app).channel)
    message = _fetched(7)
    assert await channel.decode(message, propagate=True) is message
    single = ConsumerMessage(TOPIC, 0, 7, 0.0, 0, None, b"job", b"{}", None)
    with pytest.raises(TypeError, match="sibylla.logs is a bulk topic"):
        await channel.decode(single, propagate=True)


async def test_a_batch_holds_what_is_queued_up_to_its_limit_then_what_came_within_the_wait(
        app: faust.App) -> None:
    stream = _partition_stream(app)
    taken = batches(stream, max_records=3, within_s=0.05)
    first = asyncio.ensure_future(anext(taken))
    await asyncio.sleep(0)  # the agent now waits on the partition's queue
    channel = next(c for c in app.topics if c.active_partitions == {PARTITION})
    whole, split = _fetched(0, 1), _fetched(2, 3)
    channel.queue.put_nowait(whole)
    channel.queue.put_nowait(split)
    batch = await first
    assert [e.message.offset for e in batch.events] == [0, 1, 2]
    # only the message all of whose records are taken is acknowledged with this batch, and
    # in hand until then: a rebalance or a shutdown waits for it before it commits
    assert batch.messages == [whole]
    assert whole in app.consumer.unacked and split not in app.consumer.unacked

    second = asyncio.ensure_future(anext(taken))
    await asyncio.sleep(0.01)
    later = _fetched(4)
    channel.queue.put_nowait(later)  # within the wait: same batch
    batch = await second
    assert [e.message.offset for e in batch.events] == [3, 4]
    assert batch.messages == [split, later]
    await taken.aclose()


async def test_a_record_someone_waits_for_is_batched_without_waiting_for_more(
        app: faust.App) -> None:
    """A log's last record (a termination may be waiting for it) is worked on at once; other
    records still wait for company."""
    stream = _partition_stream(app)
    taken = batches(stream, max_records=10, within_s=30.0,
                    at_once=lambda event: event.message.offset == 7)
    first = asyncio.ensure_future(anext(taken))
    await asyncio.sleep(0)
    channel = next(c for c in app.topics if c.active_partitions == {PARTITION})
    channel.queue.put_nowait(_fetched(6, 7))
    batch = await asyncio.wait_for(first, timeout=5.0)  # not the 30 s wait
    assert [e.message.offset for e in batch.events] == [6, 7]

    second = asyncio.ensure_future(anext(taken))
    await asyncio.sleep(0)
    channel.queue.put_nowait(_fetched(8))
    await asyncio.sleep(0.05)
    assert not second.done(), "a record nobody waits for waits for more"
    second.cancel()
    with pytest.raises(asyncio.CancelledError):
        await second
    await taken.aclose()


async def test_a_partitions_channel_leaves_the_conductor_when_its_agent_stops(
        app: faust.App) -> None:
    stream = _partition_stream(app)
    taken = batches(stream, max_records=10, within_s=0.0)
    pending = asyncio.ensure_future(anext(taken))
    await asyncio.sleep(0)
    assert [c.active_partitions for c in app.topics] == [{PARTITION}]
    pending.cancel()  # faust cancels the actor of a revoked partition
    with pytest.raises(asyncio.CancelledError):
        await pending
    assert list(app.topics) == []  # a stale channel would fail faust's next assignment


async def test_the_batches_end_when_faust_stops_a_revoked_partitions_actor(app: faust.App
                                                                          ) -> None:
    stream = _partition_stream(app)
    taken = batches(stream, max_records=10, within_s=0.0)
    pending = asyncio.ensure_future(anext(taken))
    await asyncio.sleep(0)
    channel = next(iter(app.topics))
    await channel.throw(StopAsyncIteration())  # what faust does on revocation
    with pytest.raises(StopAsyncIteration):
        await pending  # the iteration ends: the agent returns instead of crashing
    assert list(app.topics) == []


async def test_messages_are_acknowledged_only_after_their_batch_finished() -> None:
    consumer = _Consumer()
    messages = [_fetched(10, 11), _fetched(12)]
    for message in messages:
        message.incref()  # as faust's conductor does when it queues a message
    seen_before: list[int] = []

    async def work() -> None:
        seen_before.extend(consumer.acked)

    await acked(work(), consumer, messages)
    assert seen_before == []
    assert consumer.acked == [11, 12]


async def test_a_batch_whose_work_failed_is_acknowledged_once_it_ended() -> None:
    consumer = _Consumer()
    message = _fetched(20, 21)
    message.incref()
    seen_before: list[int] = []

    async def work() -> None:
        seen_before.extend(consumer.acked)
        raise RuntimeError("store gone")

    with pytest.raises(RuntimeError, match="store gone"):
        await acked(work(), consumer, [message])
    assert seen_before == []
    # the partition's commits go on; gaps.py reads the failed records again
    assert consumer.acked == [21]


async def test_a_batch_cancelled_midway_still_finishes_before_the_cancellation_goes_on() -> None:
    done: list[int] = []

    async def batch() -> None:
        for i in range(5):
            await asyncio.sleep(0.01)
            done.append(i)

    task = asyncio.create_task(finish(batch()))
    await asyncio.sleep(0.015)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert done == [0, 1, 2, 3, 4]


async def test_an_agent_cancelled_mid_batch_finishes_and_acknowledges_it_then_ends_quietly(
        app: faust.App) -> None:
    stream = _partition_stream(app)
    worked: list[int] = []

    async def work(events: Any) -> None:
        await asyncio.sleep(0.02)
        worked.extend(e.message.offset for e in events)

    agent = asyncio.ensure_future(consume(stream, work, max_records=10, within_s=0.0))
    await asyncio.sleep(0)
    channel = next(iter(app.topics))
    message = _fetched(0, 1)
    message.incref()
    channel.queue.put_nowait(message)
    await asyncio.sleep(0.005)  # the batch is being worked on
    agent.cancel()  # faust revokes the partition
    await agent  # no CancelledError: faust would count it as a crash
    assert worked == [0, 1]
    assert message.acked
    assert list(app.topics) == []
