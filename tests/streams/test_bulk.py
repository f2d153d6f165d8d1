"""Records taken in batches from faust's queue, worked on to the end, then acknowledged."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import faust
import pytest
from faust.types import TP, Message
from faust.types.tuples import ConsumerMessage

from sibylla.streams.bulk import BulkTopic, RecordEvent, acked, batches, consume, finish

TOPIC = "sibylla.logs"


def _message(offset: int) -> Message:
    """A record as faust's Kafka consumer hands it on."""
    return ConsumerMessage(TOPIC, 0, offset, 0.0, 0, None, b"job", b"{}", None)


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
    return SimpleNamespace(channel=topic.clone(active_partitions={TP(TOPIC, 0)}))


async def test_the_conductor_queues_the_bare_record_not_a_decoded_event(app: faust.App
                                                                        ) -> None:
    stream = _partition_stream(app)
    message = _message(7)
    event = await aiter(stream.channel).decode(message, propagate=True)
    assert event == RecordEvent(message)
    assert event.message.value == b"{}" and event.message.offset == 7


async def test_a_batch_holds_what_is_queued_up_to_its_limit_then_what_came_within_the_wait(
        app: faust.App) -> None:
    stream = _partition_stream(app)
    taken = batches(stream, max_records=3, within_s=0.05)
    first = asyncio.ensure_future(anext(taken))
    await asyncio.sleep(0)  # the agent now waits on the partition's queue
    channel = next(c for c in app.topics if c.active_partitions == {TP(TOPIC, 0)})
    for offset in range(4):
        channel.queue.put_nowait(RecordEvent(_message(offset)))
    batch = await first
    assert [e.message.offset for e in batch] == [0, 1, 2]
    # in hand until acknowledged: a rebalance or a shutdown waits for them before it commits
    assert all(e.message in app.consumer.unacked for e in batch)

    second = asyncio.ensure_future(anext(taken))
    await asyncio.sleep(0.01)
    channel.queue.put_nowait(RecordEvent(_message(4)))  # within the wait: same batch
    assert [e.message.offset for e in await second] == [3, 4]
    await taken.aclose()


async def test_a_partitions_channel_leaves_the_conductor_when_its_agent_stops(
        app: faust.App) -> None:
    stream = _partition_stream(app)
    taken = batches(stream, max_records=10, within_s=0.0)
    pending = asyncio.ensure_future(anext(taken))
    await asyncio.sleep(0)
    assert [c.active_partitions for c in app.topics] == [{TP(TOPIC, 0)}]
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


async def test_records_are_acknowledged_only_after_their_batch_finished() -> None:
    consumer = _Consumer()
    events = [RecordEvent(_message(offset)) for offset in (10, 11, 12)]
    for event in events:
        event.message.incref()  # as faust's conductor does when it queues a record
    seen_before: list[int] = []

    async def work() -> None:
        seen_before.extend(consumer.acked)

    await acked(work(), consumer, events)
    assert seen_before == []
    assert consumer.acked == [10, 11, 12]


async def test_a_batch_whose_work_failed_is_acknowledged_once_it_ended() -> None:
    consumer = _Consumer()
    events = [RecordEvent(_message(offset)) for offset in (20, 21)]
    for event in events:
        event.message.incref()
    seen_before: list[int] = []

    async def work() -> None:
        seen_before.extend(consumer.acked)
        raise RuntimeError("store gone")

    with pytest.raises(RuntimeError, match="store gone"):
        await acked(work(), consumer, events)
    assert seen_before == []
    # the partition's commits go on; gaps.py reads the failed records again
    assert consumer.acked == [20, 21]


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
    messages = [_message(offset) for offset in (0, 1)]
    for message in messages:
        message.incref()
        channel.queue.put_nowait(RecordEvent(message))
    await asyncio.sleep(0.005)  # the batch is being worked on
    agent.cancel()  # faust revokes the partition
    await agent  # no CancelledError: faust would count it as a crash
    assert worked == [0, 1]
    assert all(message.acked for message in messages)
    assert list(app.topics) == []
