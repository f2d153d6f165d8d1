"""Records taken from faust's consumer in batches, without a faust message or Event per record.

One-line log records (what syslog-ng, rsyslog and Fluent Bit send) cost the worker ~100-170 µs of
CPU each where a bare aiokafka loop spends 2-5 µs. Most of it was faust's per-record path
after the fetch: a faust message per record, its offset checks and hand-off to the topic
conductor in the fetch loop, the topic's schema decoding it into an ``Event``, the stream's
per-event iterator, ``take_events``' background buffering and one acknowledgement per record.

A :class:`BulkTopic` keeps faust's consumer, conductor and agents (fetching, rebalancing, the
co-partitioning assignor, flow control and buffer pressure, one actor per isolated partition,
offset commits) and drops the rest: the consumer (fastpath.py) hands the conductor what one
fetch returned for a partition as one :class:`BulkMessage` (its records as
:class:`RecordEvent`), which reaches the partition's queue as it is, and :func:`batches` takes
the records off the queue in batches. A message is acknowledged (its offsets may be committed)
only once the work on the batch that took its last record has ended (:func:`acked`); records
taken and never worked on (their partition was revoked meanwhile) are never acknowledged, and
whoever owns the partition next reads them again. :func:`consume` is an agent's whole loop.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, TypeVar

import faust
from faust.types import TP, Message
from faust.types.tuples import ConsumerMessage

__all__ = ["BULK_QUEUE_MESSAGES", "Batch", "BulkMessage", "BulkTopic", "Record", "RecordEvent",
           "acked", "batches", "consume", "finish"]

T = TypeVar("T")

# Messages (fetches of one partition, up to a fetch's bytes each) a bulk topic's partition
# queues at most; past a share of it the consumer stops fetching the partition (faust's buffer
# pressure). faust's default of thousands was sized for one record per message.
BULK_QUEUE_MESSAGES = 64


class Record(NamedTuple):
    """The fields of a record the agents read (``timestamp`` in seconds).

    A named tuple, and :class:`RecordEvent` a plain slotted class: two are built per record
    fetched, and as frozen dataclasses (whose ``__init__`` sets each field through
    ``object.__setattr__``) they cost 2.4 us a record, 15 % of the event loop's busy time
    on one-line records (py-spy), against 0.8 us."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp: float


class RecordEvent:
    """A record as the agents read it: ``message`` has ``topic``, ``partition``,
    ``offset``, ``key``, ``value`` and ``timestamp`` (a :class:`Record`)."""

    __slots__ = ("message", "__weakref__")  # agents hold a weak reference (in_event)

    def __init__(self, message: Any) -> None:
        self.message = message


class BulkMessage(ConsumerMessage):
    """The records of one partition that one fetch returned, as one faust message.

    Its ``offset`` is the last record's. Acknowledging it acknowledges every offset from
    ``ack_from`` to that one (``FastDrainConsumer.ack``): the records' own, and the offsets
    in between that hold none (transaction markers, compacted records), which faust's fetch
    loop would have noted as gaps."""

    __slots__ = ("ack_from", "events")

    def __init__(self, tp: TP, records: Sequence[Any], ack_from: int,
                 generation_id: int | None) -> None:
        topic, partition = tp
        last = records[-1]
        super().__init__(topic, partition, last.offset, last.timestamp / 1000.0,
                         last.timestamp_type, None, None, None, None, tp=tp,
                         generation_id=generation_id)
        self.ack_from = ack_from
        self.events = [RecordEvent(Record(topic, partition, r.offset, r.key, r.value,
                                          r.timestamp / 1000.0)) for r in records]


async def _as_queued(message: Message, *, propagate: bool = False) -> Message:
    if not isinstance(message, BulkMessage):
        raise TypeError(f"{message.topic} is a bulk topic, but a consumer without bulk "
                        "delivery (fastpath.SibyllaApp) handed it a single record")
    return message


class BulkTopic(faust.Topic):
    """A raw topic whose partitions queue :class:`BulkMessage`, not decoded events.

    Only for agents that read it through :func:`batches`, in an app whose consumer delivers
    it in bulk (``fastpath.SibyllaApp``; register its name in ``app.bulk_topics``)."""

    def __init__(self, *args: Any, maxsize: int | None = BULK_QUEUE_MESSAGES,
                 **kwargs: Any) -> None:
        super().__init__(*args, maxsize=maxsize, **kwargs)

    def _compile_decode(self) -> None:
        self.decode = _as_queued  # type: ignore[method-assign, assignment]


@dataclass(slots=True)
class Batch:
    """Records to work on, and the messages to acknowledge once that work has ended: those
    whose last record is in this batch (an earlier batch may have taken their first ones)."""

    events: list[RecordEvent] = field(default_factory=list)
    messages: list[Message] = field(default_factory=list)


class _Taker:
    """Takes records off a partition's queue into batches, splitting a message between
    batches where it holds more than a batch has room for."""

    def __init__(self, queue: Any, unacked: Any) -> None:
        self.queue = queue
        self.unacked = unacked
        self.held: BulkMessage | None = None  # a message some of whose records are taken
        self.taken = 0  # of the held message's records

    def _hold(self, message: BulkMessage) -> None:
        self.held, self.taken = message, 0

    async def wait(self) -> None:
        """Until there is a message to take from (faust ends a revoked partition's actor
        by throwing StopAsyncIteration into its queue)."""
        if self.held is None:
            self._hold(await self.queue.get())

    def fill(self, batch: Batch, max_records: int) -> None:
        """Add what is held and queued to ``batch``, up to ``max_records`` records."""
        get = self.queue.get_nowait  # also tells faust's consumer when the pressure drops
        while len(batch.events) < max_records:
            message = self.held
            if message is None:
                if self.queue.empty():
                    return
                message = get()
                self._hold(message)
            room = max_records - len(batch.events)
            batch.events.extend(message.events[self.taken:self.taken + room])
            self.taken += room
            if self.taken >= len(message.events):
                # In hand from now on, as faust's stream tracks what it takes: a rebalance,
                # and a shutdown, wait until it is acknowledged before they commit
                # (Consumer.wait_empty). Not before: a partition revoked while a message
                # was split would wait for records no agent will work on.
                message.tracked = True
                self.unacked.add(message)
                batch.messages.append(message)
                self.held = None


async def batches(stream: Any, max_records: int, within_s: float,
                  at_once: Callable[[RecordEvent], bool] | None = None
                  ) -> AsyncGenerator[Batch, None]:
    """Batches of an agent's records, each of at most ``max_records``: what is queued when
    the first record comes, then what came within ``within_s`` if that was fewer, unless a
    record queued holds ``at_once`` (someone is waiting for it: no wait for more).

    ``stream`` is the stream faust hands an agent on a :class:`BulkTopic`; only its channel
    is used. Acknowledge each batch's messages with :func:`acked` once it is finished."""
    channel = aiter(stream.channel)  # registers the partition's channel with the conductor
    taker = _Taker(channel.queue, channel.app.consumer.unacked)
    try:
        while True:
            batch = Batch()
            try:
                await taker.wait()
                taker.fill(batch, max_records)
                if len(batch.events) < max_records and within_s > 0 and not (
                        at_once is not None and any(map(at_once, batch.events))):
                    await asyncio.sleep(within_s)
                    taker.fill(batch, max_records)
            except StopAsyncIteration:
                # faust ends the actor of a revoked partition by throwing this into its
                # queue, after the rebalance waited for the batches in hand; what is left
                # was never acknowledged, and the partition's next owner reads it.
                return
            yield batch
    finally:
        channel.on_stop_iteration()  # an isolated partition's channel leaves the conductor


async def acked(work: Awaitable[None], consumer: Any, messages: Sequence[Message]) -> None:
    """Await a batch's ``work``, then acknowledge ``messages`` to faust's consumer, which
    commits offsets only up to the first one not acknowledged.

    Never before the work has ended; but also when it failed, as ``take_events`` does. Such
    a batch is not lost: the agents that must not lose a record read again whatever follows
    the last one they finished (gaps.py), and a decision not made is asked for again.
    Left unacknowledged, its records would hold back every later commit of the partition."""
    try:
        await work
    finally:
        for message in messages:
            message.ack(consumer)


async def finish(work: Awaitable[T]) -> T:
    """Await ``work`` to its end even if the awaiting task is cancelled meanwhile; then the
    cancellation goes on. (A rebalance waits the few milliseconds a batch needs rather than
    cutting it in half.)"""
    task = asyncio.ensure_future(work)
    cancelled = False
    while True:
        try:
            result = await asyncio.shield(task)
            break
        except asyncio.CancelledError:
            if task.done():
                raise
            cancelled = True
    if cancelled:
        raise asyncio.CancelledError
    return result


async def consume(stream: Any, work: Callable[[Sequence[RecordEvent]], Awaitable[None]],
                  max_records: int, within_s: float,
                  at_once: Callable[[RecordEvent], bool] | None = None) -> None:
    """An agent's loop over its :func:`batches`: each batch is worked on to its end even if
    faust cancels the agent meanwhile, then acknowledged (:func:`acked`); a revoked
    partition's agent ends quietly."""
    consumer = stream.channel.app.consumer
    # faust cancels a partition's actor when the partition is revoked and counts the
    # CancelledError as a crash: it restarts the actor, and with several partitions revoked at
    # once its supervisor ran out of restarts and exited the worker (seen in the fault
    # campaign). The batch in hand is finished first (finish), so ending quietly loses nothing.
    # The batches are closed on the way out, not when collected: the partition's channel
    # leaves the conductor before faust's next assignment looks at it.
    with contextlib.suppress(asyncio.CancelledError):
        async with contextlib.aclosing(batches(stream, max_records, within_s, at_once)
                                       ) as taken:
            async for batch in taken:
                await finish(acked(work(batch.events), consumer, batch.messages))
