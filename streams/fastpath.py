"""Cuts in faust's per-message cost and latency.

Profiling a trivial agent on Tansu (see bench/README) showed that faust's fetch loop hands each
message to the topic conductor through ``Service.wait_first(callback(message),
suspend_flow.wait())``: a race that protects against a callback blocked on a full stream
buffer during a rebalance, but creates four tasks and an ``asyncio.wait`` per message, about a
third of the framework's time per event.

Almost every callback finishes without suspending (the stream buffer has room). So we step the
callback coroutine once by hand: if it completes, that is the whole cost; if it suspends, the
rest of it runs under the original race, with identical semantics.

faust also hard-codes the consumer's ``fetch_max_wait_ms`` to 1500: a broker that holds a fetch
until that wait runs out (Tansu does) delays a decision request by up to 1.5 s. The worker
uses :data:`FETCH_MAX_WAIT_MS` instead.

And faust's conductor makes every incoming message wait while more than 100 table changelog
records are buffered (``ProducerBuffer.max_messages``), flushing them first: one ingest batch
writes a header per touched window, so under load nearly every message suspended (63% of them
in a profile). The worker allows :data:`PRODUCER_BUFFER_MAX_MESSAGES`.

At start, faust's table manager sleeps a second before it sets up the tables' changelogs and
recovery (room for tables declared after the app starts). A worker declares every table before
it starts, so that second only delayed its first decision: :class:`_TableManager` does not
sleep.

And :attr:`SibyllaApp.join_hooks` run as each group join begins: the worker starts loading
its model there (worker.py).

And :attr:`SibyllaApp.commit_hooks` run before each offset commit, and the commit waits until
the broker holds every record they and the agents sent: faust's own flush gives up waiting on
its send buffer after 0.1 s without progress.

And the records of the topics in :attr:`SibyllaApp.bulk_topics` skip faust's per-record fetch
loop: what one fetch returned for a partition goes to the conductor as one
:class:`~sibylla.streams.bulk.BulkMessage` (bulk.py), with the fetch loop's checks done once
for the batch, and its acknowledgement acknowledges the batch's offsets together.

All are selected by :class:`SibyllaApp`, so no global monkeypatching.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine, Generator, Sequence
from typing import Any

import faust
from faust.tables.manager import TableManager
from faust.transport.drivers import aiokafka as aiokafka_driver
from faust.types import TP, Message, ProducerT, TransportT
from faust.types.tuples import ack_lock
from mode.utils.futures import notify

from sibylla.streams.bulk import BulkMessage

__all__ = ["FETCH_MAX_WAIT_MS", "PRODUCER_BUFFER_MAX_MESSAGES", "SibyllaApp"]

FETCH_MAX_WAIT_MS = 50
PRODUCER_BUFFER_MAX_MESSAGES = 2_000  # bounded: the buffered records sit in memory


def _is_wait_of(coro: Any, event: Any) -> bool:
    """True when ``coro`` is the not-yet-started coroutine ``event.wait()``."""
    frame = getattr(coro, "cr_frame", None)
    return frame is not None and frame.f_code.co_name == "wait" and (
        frame.f_locals.get("self") is event
    )


async def _resume(coro: Coroutine[Any, Any, Any], yielded: Any) -> Any:
    """Drive a coroutine that already ran to its first suspension, as a Task would."""
    while True:
        if yielded is None:  # a bare yield (asyncio.sleep(0)): let the loop run once
            await asyncio.sleep(0)
        else:
            await _Waiter(yielded)
        try:
            yielded = coro.send(None)
        except StopIteration as stop:
            return stop.value


class _Waiter:
    """Awaits a future without consuming its result (the driven coroutine reads it)."""

    __slots__ = ("future",)

    def __init__(self, future: asyncio.Future[Any]) -> None:
        self.future = future

    def __await__(self) -> Generator[Any, None, None]:
        if not self.future.done():
            yield self.future


class _ConsumerThread(aiokafka_driver.AIOKafkaConsumerThread):
    def _create_worker_consumer(self, transport: Any) -> Any:
        consumer = super()._create_worker_consumer(transport)
        consumer._fetch_max_wait_ms = FETCH_MAX_WAIT_MS  # read when its fetcher starts
        return consumer

    async def on_start(self) -> None:
        await super().on_start()
        # aiokafka's fetcher sends no fetch to a broker while any partition led there holds
        # fetched records younger than its prefetch backoff (100 ms) that were not consumed
        # yet. A worker's consumer is also assigned its tables' changelog partitions, whose
        # records faust leaves unconsumed: the first write to each of them stalled every
        # fetch for 100 ms, and a lone decision after start waited for it (~110 ms instead of
        # ~10 ms for a decide request's trip through its topic then, seen for the first few
        # decisions). Without the backoff a partition with records waiting is still not
        # fetched again, as in Kafka's own clients, and the others are.
        self._ensure_consumer()._fetcher._prefetch_backoff = 0.0

    async def on_thread_stop(self) -> None:
        # With the broker gone, a fetch that failed sleeps its retry backoff; aiokafka's
        # consumer.stop() cancels it and awaits it without catching the cancellation
        # (aio-libs/aiokafka#647), so a CancelledError left this thread before it told the
        # worker it had stopped, and the worker waited faust's 60 s for it.
        try:
            await super().on_thread_stop()
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # this stop itself was cancelled
            await self._finish_consumer_stop()

    async def _finish_consumer_stop(self) -> None:
        """What aiokafka's consumer.stop() leaves undone when a cancelled fetch ends it: the
        fetcher's other requests cancelled and awaited, the client's connections closed."""
        consumer = self._ensure_consumer()
        pending = list(consumer._fetcher._pending_tasks)
        for fetch in pending:
            fetch.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        await consumer._client.close()


class FastDrainConsumer(aiokafka_driver.Consumer):
    """faust's aiokafka consumer with the per-message race taken off the common path, and
    the records of bulk topics delivered a fetch of a partition at a time."""

    def _new_consumer_thread(self) -> _ConsumerThread:
        return _ConsumerThread(self, loop=self.loop, beacon=self.beacon)

    async def _wait_next_records(self, timeout: float) -> tuple[Any, Any]:
        # faust's getmany calls this for each fetch, then hands the records it returns to
        # its fetch loop one at a time; the bulk topics' records are delivered here instead.
        records, active = await super()._wait_next_records(timeout)
        bulk_topics = self.app.bulk_topics  # type: ignore[attr-defined]  # a SibyllaApp's
        if not records or not bulk_topics:
            return records, active
        rest: dict[TP, Any] = {}
        generation = self.app.consumer_generation_id
        for tp, batch in records.items():
            if tp.topic not in bulk_topics:
                rest[tp] = batch
            elif not self.flow_active or self.should_stop or (
                    self.app.consumer_generation_id != generation):
                # as faust's getmany: a rebalance began; what this fetch returned is read
                # again from the committed offsets
                return {}, active
            elif active is None or tp in active or tp in self._buffered_partitions:
                await self._deliver_bulk(tp, batch, generation)
        return rest, active

    async def _deliver_bulk(self, tp: TP, records: Sequence[Any], generation: int) -> None:
        """What faust's fetch loop does for each record (_drain_messages), once for the
        partition's batch: drop what lies below the read offset (read again after a seek),
        commit every ``commit_every`` acknowledgements, hand the conductor the message, move
        the read offset."""
        read = self._read_offset[tp]
        if read is not None and records[0].offset < read:
            records = [r for r in records if r.offset >= read]
            if not records:
                return
        first = records[0].offset
        # Offsets between the last read and this batch hold no record (markers, compaction):
        # acknowledged with the batch, as faust's fetch loop notes them as a gap.
        ack_from = read + 1 if read and read < first else first
        self.app.monitor.track_tp_end_offset(tp, self.highwater(tp))
        if self._commit_every is not None and self._n_acked >= self._commit_every:
            self._n_acked = 0
            await self.commit()
        await self.wait_first(self.callback(BulkMessage(tp, records, ack_from, generation)),
                              self.suspend_flow.wait())
        self._read_offset[tp] = records[-1].offset

    async def _commit_offsets(self, offsets: Any, start_new_transaction: bool = True) -> bool:
        app: Any = self.app
        for hook in app.commit_hooks:
            await hook()
        # faust's flush below gives up on its send buffer once 0.1 s pass with no record sent,
        # and commits anyway. Wait until what is buffered now (the hooks' records, the agents'
        # before them: the buffer is FIFO) has gone to the client, whose own flush then waits
        # for the broker; a broker away holds the commit back (it would fail anyway), except
        # when stopping. Not until the buffer is empty: under load it never is.
        buffer = app.producer.buffer
        ahead = buffer.size
        while ahead > 0 and buffer.size and not self.should_stop:
            ahead -= await buffer.flush_atmost(ahead)
        return await super()._commit_offsets(offsets, start_new_transaction)

    def ack(self, message: Message) -> bool:
        if not isinstance(message, BulkMessage):
            return super().ack(message)
        with ack_lock:  # faust's, for the reasons Consumer.ack gives
            if message.acked:
                return False
            message.acked = True
            self._unacked_messages.discard(message)
            tp = message.tp
            try:
                if not self.app.topics.acks_enabled_for(message.topic):
                    return False
                committed = self._committed_offset[tp]
                low = message.ack_from if committed is None else max(message.ack_from,
                                                                     committed)
                index = self._acked_index[tp]
                fresh = set(range(low, message.offset + 1)) - index
                index.update(fresh)
                self._acked[tp].extend(fresh)  # sorted when a commit reads it
                self._n_acked += len(fresh)
                return bool(fresh)
            finally:
                notify(self._waiting_for_ack)

    async def wait_first(self, *coros: Any, timeout: Any = None) -> Any:
        if timeout is None and len(coros) == 2 and _is_wait_of(coros[1], self.suspend_flow):
            callback, suspend_wait = coros
            if not self.suspend_flow.is_set():
                try:
                    yielded = callback.send(None)
                except StopIteration:
                    suspend_wait.close()
                    return None
                return await super().wait_first(_resume(callback, yielded), suspend_wait)
        return await super().wait_first(*coros, timeout=timeout)


class _FastTransport(aiokafka_driver.Transport):
    Consumer = FastDrainConsumer


class _TableManager(TableManager):
    async def on_start(self) -> None:
        # faust's, without its one-second sleep first (see the module's docstring)
        if not self.should_stop:
            await self._update_channels()
            await self.recovery.start()


class SibyllaApp(faust.App):
    """The faust app of a Sibylla worker."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, TableManager=_TableManager, **kwargs)
        # Called as each group join begins, in the consumer's thread: quick, thread-safe.
        self.join_hooks: list[Callable[[], None]] = []
        # Topics whose records go to their agents a fetch at a time (bulk.py); read only
        # through bulk.batches.
        self.bulk_topics: set[str] = set()
        # Awaited before each offset commit, in the task that commits: what they write to
        # tables or topics is on the broker before the offsets are (FastDrainConsumer).
        self.commit_hooks: list[Callable[[], Awaitable[None]]] = []

    def on_rebalance_start(self) -> None:
        # faust calls this from the rebalance listener before the consumer sends its
        # JoinGroup request.
        super().on_rebalance_start()
        for hook in self.join_hooks:
            hook()

    def _new_transport(self) -> TransportT:
        return _FastTransport(self.conf.broker_consumer, self)

    def _new_producer(self) -> ProducerT:
        producer = super()._new_producer()
        producer.buffer.max_messages = PRODUCER_BUFFER_MAX_MESSAGES
        return producer
