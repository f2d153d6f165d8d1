"""Records taken from faust's consumer in batches, without a faust Event per record.

One-line log records (what syslog-ng, rsyslog and Fluent Bit send) cost the worker ~100-170 µs of
CPU each where a bare aiokafka loop spends 2-5 µs. Most of it was faust's per-record path
after the fetch: the topic's schema decoding each record into an ``Event``, the stream's
per-event iterator (processors, sensors, the current-event bookkeeping), ``take_events``'
background buffering (a coroutine per record, events handed over through ``asyncio.Event``)
and one acknowledgement call per event through the stream.

A :class:`BulkTopic` keeps faust's consumer, conductor and agents (fetching, rebalancing, the
co-partitioning assignor, flow control and buffer pressure, one actor per isolated partition)
and drops the rest: its records reach the partition's queue as :class:`RecordEvent` (the bare
message), and :func:`batches` takes them off the queue in batches. A record is acknowledged
(its offset may be committed) only once the work on its batch has ended (:func:`acked`); a
batch taken and never worked on (its partition was revoked meanwhile) is never acknowledged,
and whoever owns the partition next reads it again. :func:`consume` is an agent's whole loop.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import faust
from faust.types import Message

__all__ = ["BulkTopic", "RecordEvent", "acked", "batches", "consume", "finish"]

T = TypeVar("T")


@dataclass(frozen=True, slots=True, weakref_slot=True)  # agents hold a weakref (in_event)
class RecordEvent:
    """A record as the agents read it: ``message`` has ``topic``, ``partition``,
    ``offset``, ``key``, ``value`` and ``timestamp`` (a faust message, or a record read
    again by gaps.py)."""

    message: Any


async def _as_record_event(message: Message, *, propagate: bool = False) -> RecordEvent:
    return RecordEvent(message)


class BulkTopic(faust.Topic):
    """A raw topic whose records are queued as :class:`RecordEvent`, not decoded events.

    Only for agents that read it through :func:`batches`: a faust stream over it would get
    objects that are not events."""

    def _compile_decode(self) -> None:
        self.decode = _as_record_event  # type: ignore[method-assign, assignment]


def _take(unacked: Any, event: RecordEvent, batch: list[RecordEvent]) -> None:
    # Tracked as faust's stream tracks the events it takes: a rebalance, and a shutdown,
    # wait until these are acknowledged before they commit (Consumer.wait_empty).
    message = event.message
    message.tracked = True
    unacked.add(message)
    batch.append(event)


def _drain(queue: Any, unacked: Any, batch: list[RecordEvent], max_records: int) -> None:
    get = queue.get_nowait  # also tells faust's consumer when the queue's pressure drops
    while len(batch) < max_records and not queue.empty():
        _take(unacked, get(), batch)


async def batches(stream: Any, max_records: int, within_s: float
                  ) -> AsyncGenerator[list[RecordEvent], None]:
    """Batches of an agent's records, each of at most ``max_records``: what is queued when
    the first record comes, then what came within ``within_s`` if that was fewer.

    ``stream`` is the stream faust hands an agent on a :class:`BulkTopic`; only its channel
    is used. Acknowledge each batch with :func:`acked` once it is finished."""
    channel = aiter(stream.channel)  # registers the partition's channel with the conductor
    queue = channel.queue
    unacked = channel.app.consumer.unacked
    try:
        while True:
            batch: list[RecordEvent] = []
            try:
                _take(unacked, await queue.get(), batch)
                _drain(queue, unacked, batch, max_records)
                if len(batch) < max_records and within_s > 0:
                    await asyncio.sleep(within_s)
                    _drain(queue, unacked, batch, max_records)
            except StopAsyncIteration:
                # faust ends the actor of a revoked partition by throwing this into its
                # queue, after the rebalance waited for the batches in hand; what is left
                # was never acknowledged, and the partition's next owner reads it.
                return
            yield batch
    finally:
        channel.on_stop_iteration()  # an isolated partition's channel leaves the conductor


async def acked(work: Awaitable[None], consumer: Any, events: Sequence[RecordEvent]) -> None:
    """Await a batch's ``work``, then acknowledge its records to faust's consumer, which
    commits offsets only up to the first record not acknowledged.

    Never before the work has ended; but also when it failed, as ``take_events`` does. Such
    a batch is not lost: the agents that must not lose a record read again whatever follows
    the last one they finished (gaps.py), and a decision not made is asked for again.
    Left unacknowledged, its records would hold back every later commit of the partition."""
    try:
        await work
    finally:
        for event in events:
            event.message.ack(consumer)


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
                  max_records: int, within_s: float) -> None:
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
        async with contextlib.aclosing(batches(stream, max_records, within_s)) as taken:
            async for events in taken:
                await finish(acked(work(events), consumer, events))
