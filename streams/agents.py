"""The worker's agents: ingest logs, track terminations, decide.

Data flow (all topics keyed by job_id and co-partitioned, every agent isolated per partition so
a batch of events and the table writes it causes belong to one partition):

    logs ──────────► ingest ──► windows table (tail + first error block per attempt)
    job-events ────► terminations ─┬─► log ended: decided with the batch of terminations ─┐
                                   └─► pending table ─► the partition's decide task ──────┤
                                       (grace period over, or end of stream)              │
           decisions topic, decided table ◄── model ◄── micro-batcher ◄───────────────────┘
                                  window reader (reading.py) ◄─┘ (beside the model)

A failed attempt whose log has ended when its termination comes (the shipper marked its end
of stream) is decided before the termination is acknowledged: a crash replays the termination.
Any other is written to the pending table, the durable record of a decision owed, and decided
in process (:meth:`Pipeline._decide_soon`) by the partition's decide task, when ingest takes
the end of its log or the timer finds its grace period over. A worker that stops first leaves
it pending, and its successor's timer asks again once the grace period is over and ingest has
taken the job's log (after a restart the window is rebuilt from the records replayed beside
it). No decision goes through a topic of its own: that hop cost a produce, a fetch and an
agent batch per failure.

At least once: an event is acknowledged only after its table writes and sends are queued, and
faust flushes the producer before it commits offsets (sends use ``force=True``: faust would
otherwise hold them back until the next commit, adding up to a commit interval of latency),
so a crash replays events whose effects may be lost and loses nothing. Replays are idempotent:
an attempt found in the decided table is never classified again. It is written there only once
the broker has acknowledged the decision, because the local store (RocksDB) survives a SIGKILL
that the producer's buffer does not: marked first, a decision killed in the buffer would be
skipped by every replay.

One record never takes others with it: a batch is acknowledged once the agent's work on it has
ended, however it ended (bulk.py), so every record is handled inside the loop, and one that
cannot be (whatever it holds) goes to the dead-letter topic with the reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import itertools
import logging
import os
import threading
import time
import weakref
from collections import defaultdict, deque
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from contextvars import Token
from typing import Any, Generic, NamedTuple, TypeVar

import orjson
from faust.streams import _current_event  # read by faust.current_event(); no public setter
from faust.types import TP

from sibylla.inference.api import Classifier, LogWindow, Prediction
from sibylla.schemas.records import (
    REASON_CLASSES,
    DeadLetter,
    Decision,
    FieldMap,
    JobEvent,
    LogChunk,
    ReasonClass,
    RecordError,
    parse_job_event,
    parse_log_records,
)
from sibylla.simulator.reliability import FailureRateEstimator
from sibylla.streams import bulk
from sibylla.streams.activity import Activity, DeadLetterNote
from sibylla.streams.app import Topology
from sibylla.streams.batcher import MicroBatcher
from sibylla.streams.gaps import GapFiller
from sibylla.streams.keys import attempt_key, partition_of, split_key
from sibylla.streams.lag import LagProbe
from sibylla.streams.ledger import CLOCK_SKEW_S, DecisionLedger
from sibylla.streams.memory import AttemptMemory
from sibylla.streams.metrics import WorkerMetrics
from sibylla.streams.policy import CLASSIFIER_ERROR_CATEGORY
from sibylla.streams.reading import WindowReader, WindowReading, read_window
from sibylla.streams.reread import PartitionReader
from sibylla.streams.state import WindowCache, live_get, live_items, live_items_of
from sibylla.streams.window import TailWindow, WindowLimits
from sibylla.streams.window_store import SEGMENT_CHUNKS, WindowStore

__all__ = ["Decided", "Pipeline"]

R = TypeVar("R")
T = TypeVar("T")

log = logging.getLogger(__name__)

INGEST_BATCH = 4096  # messages per ingest batch: one table write per touched window
# Ingest waits this long for more records to batch with the first, unless one may end its log
# (_may_end_log): a lone failure's decision waited those 10 ms for its log's last record.
INGEST_WITHIN_S = 0.01
# Terminations are taken as they are queued, with no wait for more: a lone failure's decision
# is not held back, and the micro-batcher forms the model's batches.
EVENTS_BATCH = 512
SWEEP_EVERY_S = 30.0
REQUEST_RETRY_S = 10.0  # ask again for a decision not made within this (e.g. the model failed)
CATCH_UP_LIMIT_S = 30.0  # longest wait past the grace period for ingest to catch up
# A decided attempt's window is freed this long after the decision, not at once. The table
# writes of a decision reach their changelogs independently; a worker killed in between could
# leave its successor the window's deletion without the decided mark, and that successor
# decided the attempt again on an empty window (seen in the fault campaign). Several commit
# intervals later (each commit flushes the producer) the decided mark is durable.
RELEASE_AFTER_S = 5.0
SAVE_YIELD_EVERY = 200  # windows saved in a commit between two turns of the event loop
STALL_CHECK_EVERY_S = 2.0
# A termination an earlier owner of its partition may have taken (and decided) is checked
# against the decisions topic (ledger.py): one below the partition's end when this worker got
# it. When that end or the termination's offset is unknown, every decision is checked for
# this long after the worker gets the partition: replays after a restart or a hand-over come
# within the grace period, the catch-up wait and a re-request of that.
LEDGER_CHECK_S = 120.0


class _AskedOnce(Generic[T]):
    """A question to the broker, asked when first awaited; later awaits get that answer."""

    def __init__(self, ask: Callable[..., Awaitable[T]], *args: Any) -> None:
        self._ask, self._args = ask, args
        self._answer: tuple[T] | None = None

    async def __call__(self) -> T:
        if self._answer is None:
            self._answer = (await self._ask(*self._args),)
        return self._answer[0]


class _ToDecide(NamedTuple):
    """A decision to make."""

    job: JobEvent  # the termination
    event_time: float  # when it happened (the broker's timestamp, seconds)
    window: LogWindow  # what the model reads
    offset: int | None  # the termination's offset in its partition; None: unknown


# What the model's batch gives a window: its prediction and the reading of its text.
_Read = tuple[Prediction, WindowReading]
# A decision made, as the decided hooks get it: its window and the reading of its text.
Decided = tuple[LogWindow, Decision, WindowReading]


def _may_end_log(event: Any) -> bool:
    """Whether a log record may mark the end of its log (``eos``), at a glance of its bytes:
    a termination may be waiting for it, so ingest takes it without waiting for more records.
    A false hint (the word in a line's text) only costs that wait; parsing decides."""
    value = event.message.value
    return value is not None and b'"eos"' in value


def _append_arrived(windows: Mapping[str, TailWindow],
                    arrived: dict[str, tuple[list[str], int]], now: float) -> None:
    """Append each window's gathered lines and move its ``last_offset`` to the record they
    last came in, then forget them. Called before the ingest agent awaits anything, as well
    as at the end of its batch: a commit may save the windows whenever the agent awaits, and
    a window saved with a record's offset but without its lines would skip that record as
    already in when a restart replays it (``bench/chaos.py`` found it)."""
    for key, (lines, offset) in arrived.items():
        window = windows[key]
        window.extend(lines, now)
        window.last_offset = offset
    arrived.clear()


class Pipeline:
    """Registers the agents, timers and pages of a worker on a :class:`Topology`."""

    def __init__(self, topology: Topology, classifier: Classifier | Future[Classifier],
                 metrics: WorkerMetrics | None = None) -> None:
        """``classifier`` may still be loading (a future): run_worker starts the load as the
        group join begins, so that torch's import (~2 s) overlaps the join instead of
        preceding it. Predictions wait for it in the inference thread; :meth:`model` awaits
        it."""
        self.t = topology
        self.settings = s = topology.settings
        self._model = classifier if isinstance(classifier, Future) else _loaded(classifier)
        self.metrics = metrics or WorkerMetrics()
        self.activity = Activity()  # what the status page shows; the model once loaded
        # Every dead-letter series exists from the start at 0, so that Prometheus counts the
        # first rejected records as an increase (a series born at N has no increase).
        for topic in (topology.logs, topology.job_events):
            for kind in REASON_CLASSES:
                self.metrics.dead_letters.labels(topic=topic.get_topic_name(), reason=kind)
        self.limits = WindowLimits.of(s)
        self.store = WindowStore(topology.windows, topology.window_chunks, self.limits)
        self.cache = WindowCache(self.store, s.partitions)
        # Counted when scraped: windows also go when decided, released or expired.
        self.metrics.active_windows.set_function(lambda: len(self.cache))
        field_map = FieldMap.parse(s.field_map)
        self.field_map = field_map if field_map.paths else None  # none: no lookup per record
        self.reader = WindowReader()  # reads the windows' text beside the model (reading.py)
        self.batcher: MicroBatcher[LogWindow, _Read] = MicroBatcher(
            self._predict, s.batch_max_windows, s.batch_max_wait_ms / 1000.0,
            on_batch=self.metrics.on_batch,
        )
        # r_f and MTTF from the job events of this worker's partitions (exported as metrics).
        self.reliability = FailureRateEstimator()
        self._requested: dict[str, float] = {}  # attempt key -> when its decision was asked
        # partition -> the attempts to decide, in the order asked (_decide_soon), and the task
        # deciding them
        self._to_decide: dict[int, dict[str, None]] = defaultdict(dict)
        self._deciders: dict[int, asyncio.Task[None]] = {}
        self._ingested: dict[int, int] = {}  # partition -> offset of the last log record taken
        # Called with each decide batch's new decisions (and their windows and readings)
        # in the partition's context (in_partition: table writes there land on the jobs'
        # partition): online learning keeps the texts it needs.
        self.decided_hooks: list[Callable[[Sequence[Decided]], Awaitable[None]]] = []
        # Each job's earlier attempts, for the policy with memory.
        self.memory = AttemptMemory(topology.history, s, self.metrics)
        self._windows_swept: dict[int, float] = {}  # partition -> last TTL sweep
        # partition -> (when, attempt key) of decided windows to free (RELEASE_AFTER_S)
        self._to_release: dict[int, deque[tuple[float, str]]] = defaultdict(deque)
        # partition -> the stand-in event whose context its table writes take (in_partition)
        self._partition_events: dict[int, bulk.RecordEvent] = {}
        self._decisions_swept: dict[int, float] = {}
        # Records read again out of band, each with a reader of its own: a long read of a
        # skipped range must not hold up the decide path's check of the decisions topic.
        self.gaps = GapFiller(PartitionReader(s), topology.offsets)
        self._stall_checked = time.monotonic()  # the last stall check (_catch_up_stalled)
        self._assigned_at: dict[int, float] = {}  # partition -> when this worker got it
        # partition -> the job-events partition's end then: no earlier owner can have taken a
        # termination at or above it (_may_be_decided_elsewhere)
        self._replays_end: dict[int, int] = {}
        # (topic, partition) -> deliveries of the running batch's dead letters and re-keyed
        # records, awaited before the batch is marked finished (_finished)
        self._sent: dict[tuple[str, int], list[Awaitable[Any]]] = defaultdict(list)
        self.ledger = DecisionLedger(PartitionReader(s), topology.decisions.get_topic_name())
        # What runs in the background (reads ahead, the reader's start), cancelled at shutdown
        self._background: set[asyncio.Future[None]] = set()
        # Offsets asked of the broker out of band (bounded waits), and the lag gauge's source.
        self.offsets = LagProbe(s, [s.topic("logs"), s.topic("job-events")])

    # ---------------------------------------------------------------- set-up
    def register(self) -> None:
        app = self.t.app
        app.agent(self.t.logs, name="ingest", isolated_partitions=True)(self._ingest)
        app.agent(self.t.job_events, name="terminations", isolated_partitions=True)(
            self._terminations)
        app.task(self._warm_up)
        app.timer(0.25, name="request_due_decisions")(self._request_due_decisions)
        app.timer(STALL_CHECK_EVERY_S, name="catch_up_stalled")(self._catch_up_stalled)
        app.on_partitions_revoked.connect(self._on_revoked)
        app.commit_hooks.append(self._save_windows)
        app.commit_hooks.append(self._save_marks)
        app.on_partitions_assigned.connect(self._on_assigned)
        app.on_before_shutdown.connect(self._close_clients)

    @property
    def classifier(self) -> Classifier:
        """The model deciding now. Only once loaded (a decision's predictions came from it);
        before that, await :meth:`model`."""
        return self._model.result(timeout=0)

    def model_loaded(self) -> bool:
        """Is the model in (the worker's first load can still be running)?"""
        return self._model.done()

    async def model(self) -> Classifier:
        """The model deciding now, once loaded."""
        return await asyncio.wrap_future(self._model)

    def _predict(self, windows: Sequence[LogWindow]) -> list[_Read]:
        """The batcher's function, in the inference thread: waits there for the model's
        first load, and a batch running while a model is swapped in ends with the old one.
        The reader process reads the windows' text meanwhile (reading.py)."""
        reading = self.reader.submit(windows)
        predictions = self._model.result().predict(windows)
        return list(zip(predictions, self.reader.result(reading, windows), strict=True))

    def swap_classifier(self, classifier: Classifier,
                        scores: Mapping[str, Any] | None = None) -> None:
        """Use another model from the next micro-batch on (the running batch finishes).
        ``scores``: its gate scores, when known (the status page shows them). The model
        replaced is closed once its last batch is done (its process stops)."""
        replaced = self._model
        self._model = _loaded(classifier)
        self._show_model(classifier, scores)
        replaced.add_done_callback(_close_model)  # now, or once a load still running ends

    def _show_model(self, classifier: Classifier,
                    scores: Mapping[str, Any] | None = None) -> None:
        """Name the deciding model, and where it runs, in the metrics and on the status page.
        The model's classifiers say where they run (``device``); the baselines run on the CPU.
        """
        device = str(getattr(classifier, "device", "cpu"))
        self.metrics.set_model(classifier.version, device)
        self.activity.set_model(classifier.version, device, scores)

    async def _on_revoked(self, app: Any, revoked: set[TP], **_: Any) -> None:
        """Forget what this worker knew of a partition it no longer owns: if it comes back,
        its windows are rebuilt from the table and its log offset is asked of the consumer
        (a stale one could make decisions wait for records long ingested)."""
        partitions = self.settings.partitions
        for tp in revoked:
            if tp.topic != self.t.logs.get_topic_name():
                continue
            decider = self._deciders.pop(tp.partition, None)
            if decider is not None:
                decider.cancel()  # as faust stops a revoked partition's agents
            self.cache.forget(tp.partition)
            self.ledger.forget(tp.partition)
            self.gaps.forget(tp.partition)
            for per_partition in (self._ingested, self._windows_swept, self._decisions_swept,
                                  self._assigned_at, self._replays_end, self._to_release,
                                  self._partition_events, self._to_decide):
                per_partition.pop(tp.partition, None)
            for key in [k for k in self._requested
                        if partition_of(split_key(k)[0], partitions) == tp.partition]:
                del self._requested[key]

    async def _close_clients(self, app: Any, **_: Any) -> None:
        """Stop the consumers kept outside faust's (offsets asked, records read again) and
        the window reader's process."""
        for task in [*self._background, *self._deciders.values()]:
            task.cancel()
        await asyncio.to_thread(self.reader.close)  # it waits for the batch being read
        await self.offsets.close()
        await self.gaps.reader.close()
        await self.ledger.reader.close()

    async def _warm_up(self) -> None:
        """Once the model is loaded, one prediction on a made-up failure while the worker
        joins its group, so that the first real decision does not pay the model's one-time
        costs (~100 ms on CPU). A model that cannot be loaded stops the worker: it could
        decide nothing. The window reader's process starts after that, in the background:
        started with the model's load it competed with it for the CPU, on the way to the
        first decision, which it never serves (a batch that small is read in place)."""
        try:
            classifier = await self.model()
        except Exception as exc:  # noqa: BLE001 - ModelLoadError says what and where
            log.critical("the model could not be loaded, the worker stops: %s", exc)
            await self.t.app.crash(exc)
            return
        self._show_model(classifier)
        lines = [f"step {i} loss 0.{i:04d}" for i in range(64)] + [
            "Traceback (most recent call last):", "RuntimeError: CUDA error: out of memory"]
        try:
            await self.batcher.warm_up([LogWindow("warm-up", 0, lines, lines[-2:],
                                                  len(lines))])
        except Exception:  # noqa: BLE001 - a model failing here fails on real windows too
            log.warning("model warm-up failed", exc_info=True)
        # What start-up allocated (torch, faust, the model: millions of objects) lives as long
        # as the process; out of the collector's way, a full collection no longer walks it
        # (150-250 ms of the event loop each, seen delaying a lone decision to ~200 ms).
        gc.freeze()
        self._in_background(asyncio.to_thread(self.reader.start))

    async def _on_assigned(self, app: Any, assigned: set[TP], **_: Any) -> None:
        now = time.time()
        new = sorted(tp.partition for tp in assigned if tp.topic == self.t.logs.get_topic_name()
                     and tp.partition not in self._assigned_at)
        for partition in new:
            self._assigned_at[partition] = now
            # The replays of the partition are checked against the decisions topic
            # (_may_be_decided_elsewhere): read what it holds now rather than on the first
            # decision's path.
            self._in_background(self.ledger.warm(partition,
                                                 now - LEDGER_CHECK_S - CLOCK_SKEW_S))
        if new:
            self._in_background(self._note_replays_end(new, now))

    async def _note_replays_end(self, partitions: Sequence[int], assigned_at: float) -> None:
        """Keep where the partitions' terminations stood when this worker got them (at
        ``assigned_at``; one request for all): an earlier owner stopped taking them before the
        hand-over, so one at or above that end was never taken by anyone else, and its
        decision needs no check against the decisions topic (a read per decide batch, queued
        behind the others of the worker). No answer: every decision is checked while the
        partition is new."""
        ends = await self.offsets.end_offsets(self.t.job_events.get_topic_name(), partitions)
        for partition, end in (ends or {}).items():
            if self._assigned_at.get(partition) == assigned_at:  # still the same ownership
                self._replays_end[partition] = end

    def _in_background(self, work: Awaitable[None]) -> None:
        """Run ``work`` as a task kept until it ends (the loop holds tasks weakly only)."""
        task = asyncio.ensure_future(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _working(self, handle: Callable[[Sequence[Any]], Awaitable[None]]
                 ) -> Callable[[Sequence[Any]], Awaitable[None]]:
        """``handle`` (an agent's batch), known to the stall check while it runs
        (gaps.GapFiller.working)."""
        async def run(events: Sequence[Any]) -> None:
            first = events[0].message
            with self.gaps.working(first.topic, first.partition):
                await handle(events)
        return run

    async def _with_missing(self, events: Sequence[Any]) -> Sequence[Any]:
        """The batch, preceded by the records the consumer skipped before it (gaps.py)."""
        self.in_partition(events[0].message.partition)
        found = await self.gaps.with_missing(events)
        if len(found) > len(events):
            self.metrics.refetched.labels(topic=events[0].message.topic).inc(
                len(found) - len(events))
        return found

    async def _finished(self, events: Sequence[Any]) -> None:
        """Mark the batch finished (gaps.py), once the broker holds what it sent. The mark
        tells a successor that these records need no replay, so it must not become durable
        before their dead letters and re-keyed copies: a fault campaign lost two dead
        letters when a worker was killed with them in its producer's buffer and its mark
        already on the changelog. (It is written at the next commit: :meth:`_save_marks`.)"""
        await self._delivered(events)
        self.gaps.mark(events)

    async def _delivered(self, events: Sequence[Any]) -> None:
        """Wait until the broker holds the batch's dead letters and re-keyed records. If one
        was not delivered, the worker exits before the batch is acknowledged (a restart
        replays it)."""
        first = events[0].message
        sent = self._sent.pop((first.topic, first.partition), None)
        if sent:
            try:
                await asyncio.gather(*sent)
            except Exception:  # noqa: BLE001 - see the docstring
                log.critical("%s[%d]: a record's dead letter or re-keyed copy was not "
                             "delivered; exiting so that a restart replays the batch",
                             first.topic, first.partition, exc_info=True)
                logging.shutdown()
                os._exit(70)

    # ---------------------------------------------------------------- helpers
    async def _dead_letter(self, event: Any, reason: str, kind: ReasonClass, agent: str
                           ) -> None:
        """Send a record the agent cannot take to the dead-letter topic. If even that fails,
        the worker exits at once: its batch is then never acknowledged, and a restart replays
        it, where carrying on would acknowledge a record that went nowhere."""
        msg = event.message
        try:
            letter = DeadLetter(reason, msg.topic, msg.partition, msg.offset, msg.key,
                                msg.value, agent)
            self._sent[(msg.topic, msg.partition)].append(
                await self.t.deadletter.send(key=msg.key, value=letter.to_json(), force=True))
        except Exception:  # noqa: BLE001 - see the docstring
            log.critical("cannot dead-letter %s[%d]@%d; exiting so that a restart replays it",
                         msg.topic, msg.partition, msg.offset, exc_info=True)
            logging.shutdown()
            os._exit(70)
        self.metrics.dead_letters.labels(topic=msg.topic, reason=kind).inc()
        self.activity.on_dead_letter(DeadLetterNote(time.time(), msg.topic, kind, reason))
        log.warning("dead letter from %s[%d]@%d: %s", msg.topic, msg.partition, msg.offset,
                    reason)

    async def _reject(self, event: Any, exc: Exception, agent: str) -> None:
        """Dead-letter a record its parser refused: a contract violation with its reason,
        anything else with the error (a parser bug must cost one record, not the batch faust
        would acknowledge with it)."""
        if isinstance(exc, RecordError):
            await self._dead_letter(event, str(exc), exc.kind, agent)
            return
        log.error("%s could not parse a record", agent, exc_info=exc)
        await self._dead_letter(event, f"internal error: {type(exc).__name__}: {exc}",
                                "invalid_field", agent)

    async def _parsed(self, event: Any, parse: Callable[[Any], R], agent: str) -> R | None:
        """``parse(value)``, or None once the record is dead-lettered (:meth:`_reject`)."""
        try:
            return parse(event.message.value)
        except Exception as exc:  # noqa: BLE001 - every failure is dead-lettered
            await self._reject(event, exc, agent)
            return None

    def in_event(self, event: Any) -> Token[Any]:
        """Make ``event`` this task's current event; the token undoes it. The caller keeps
        ``event`` alive while it writes: faust holds only a weak reference."""
        # faust routes a table write to the changelog partition of the *current event*; an
        # agent reading batches (bulk.py) has none, so name it (same partition: the agent is
        # isolated per partition). Only the task's context variable is set: a stream's
        # ``current_event`` belongs to faust's iterator (the operator-votes agent has one).
        return _current_event.set(weakref.ref(event))

    def in_partition(self, partition: int) -> None:
        """Make this task's table writes go to ``partition``'s changelogs."""
        self.in_event(self._partition_event(partition))

    def _partition_event(self, partition: int) -> bulk.RecordEvent:
        """The event standing for ``partition`` in table writes, kept here until the
        partition is revoked (a caller that may outlive that keeps it while it writes).
        faust reads only the current event's topic and partition to route a write, and
        decisions and saves are made outside any record's batch: a timer's decision after a
        restart may have no record of the partition to borrow."""
        event = self._partition_events.get(partition)
        if event is None:
            event = self._partition_events[partition] = bulk.RecordEvent(bulk.Record(
                self.t.logs.get_topic_name(), partition, -1, None, None, 0.0))
        return event

    # ---------------------------------------------------------------- ingest
    async def _ingest(self, stream: Any) -> None:
        await bulk.consume(stream, self._working(self._ingest_batch), INGEST_BATCH,
                           INGEST_WITHIN_S, at_once=_may_end_log)

    def _parse_logs(self, events: Sequence[Any]) -> list[LogChunk | Exception]:
        return parse_log_records([event.message.value for event in events],
                                 self.settings.max_line_bytes, self.field_map)

    async def _ingest_batch(self, events: Sequence[Any]) -> None:
        events = await self._with_missing(events)
        m, cache = self.metrics, self.cache
        decided, pending = self.t.decided, self.t.pending
        partition = events[0].message.partition
        now = time.time()
        touched: dict[str, TailWindow] = {}
        # Each window's lines of the batch (and the offset of the last record they came in),
        # appended together: a window takes many lines for the cost of a few (window.py),
        # the lines of one-line records too.
        arrived: dict[str, tuple[list[str], int]] = {}
        decided_in_batch: dict[str, bool] = {}
        ended: list[tuple[str, int]] = []
        lines = nbytes = records = late = 0
        # parsed together, not through _parsed(): no coroutine per record on the hottest path
        for event, chunk in zip(events, self._parse_logs(events), strict=True):
            msg = event.message
            if isinstance(chunk, Exception):  # every failure is dead-lettered
                _append_arrived(touched, arrived, now)
                await self._reject(event, chunk, "ingest")
                continue
            if msg.key != chunk.job_id.encode():
                # Keyed otherwise, it sits on a partition that may not hold the job's window:
                # re-publish it under its job_id rather than lose or misfile it.
                _append_arrived(touched, arrived, now)
                self._sent[(msg.topic, partition)].append(await self.t.logs.send(
                    key=chunk.job_id.encode(), value=msg.value, force=True))
                m.rekeyed.inc()
                continue
            key = attempt_key(chunk.job_id, chunk.attempt)
            was_decided = decided_in_batch.get(key)
            if was_decided is None:  # one table read per attempt per batch, not per record
                was_decided = decided_in_batch[key] = live_get(decided, key) is not None
            if was_decided:
                late += len(chunk.lines)
                continue
            window = cache.get_or_create(partition, key)
            gathered = arrived.get(key)
            # Replayed after a crash, or again within this batch after a seek: already in
            # the window, or among the lines gathered for it (their offset is the newer).
            if msg.offset <= (window.last_offset if gathered is None else gathered[1]):
                continue
            if gathered is None:
                arrived[key] = (list(chunk.lines), msg.offset)
            else:
                gathered[0].extend(chunk.lines)
                arrived[key] = (gathered[0], msg.offset)
            touched[key] = window
            if chunk.eos and not window.eos:
                window.eos = True
                ended.append((chunk.job_id, chunk.attempt))
            lines += len(chunk.lines)
            nbytes += len(msg.value)
            records += 1
        _append_arrived(touched, arrived, now)
        # Every table write below goes to this partition's changelogs.
        self.in_partition(partition)
        for key, window in touched.items():  # their lines, a segment's worth at a time
            # An ended log waits for the commit's save: its attempt is usually decided
            # before then, and a decided window is never written (_mark_decided).
            if not window.eos:
                self.store.save_chunks(key, window, SEGMENT_CHUNKS)
        self.cache.changed(partition, touched)  # the rest, before the next commit
        for job_id, attempt in ended:
            if live_get(pending, attempt_key(job_id, attempt)) is not None:
                self._decide_soon(partition, attempt_key(job_id, attempt))
        self._ingested[partition] = events[-1].message.offset
        await self._finished(events)
        m.lines.inc(lines)
        m.bytes.inc(nbytes)
        m.records.inc(records)
        if late:
            m.late_lines.inc(late)
        self._release_decided(partition, now)
        if now - self._windows_swept.get(partition, 0.0) > SWEEP_EVERY_S:
            self._windows_swept[partition] = now
            self._expire_windows(partition, now)
            m.window_bytes.set(cache.text_bytes())  # O(windows): with the sweep, not per batch

    async def _save_windows(self) -> None:
        """Save the windows ingest changed since they were last saved (state.py), each in the
        event context of its partition. Run before every offset commit (fastpath.py): the
        changelog then holds every line of the records whose offsets are committed, but for
        attempts decided by then, whose decided mark it holds instead (_mark_decided)."""
        saved = 0
        for partition in self.cache.partitions_changed():
            changed = self.cache.take_changed(partition)
            # This task's context: the agents that run at the sleep below keep their own.
            with self._writing_for(partition):
                for key, window in changed.items():
                    if not self.cache.holds(partition, key, window):
                        continue  # freed while this commit let the agents run: not to return
                    self.store.save(key, window)
                    saved += 1
                    if saved % SAVE_YIELD_EVERY == 0:
                        # Let the agents run: what they change now is in no offset this
                        # commit covers (chosen before the hooks), and is saved by the next.
                        await asyncio.sleep(0)

    async def _save_marks(self) -> None:
        """Write the marks of the batches finished since the last commit (gaps.py), each in
        the event context of its partition; run before every offset commit."""
        for partition in self.gaps.unsaved_partitions():
            with self._writing_for(partition):
                self.gaps.save(partition)

    @contextlib.contextmanager
    def _writing_for(self, partition: int) -> Iterator[None]:
        """Route this task's table writes to ``partition``'s changelogs for the block, outside
        any agent's batch (a commit hook). The partition's event is held here for the block:
        a revocation while it yields drops the partition's own, and a weak reference alone
        died with it ("Cannot modify table key from outside of stream iteration" crashed the
        worker's commit when ingest replaced the event the save used)."""
        event = self._partition_event(partition)
        token = self.in_event(event)
        try:
            yield
        finally:
            _current_event.reset(token)

    def _release_decided(self, partition: int, now: float) -> None:
        """Free the windows of attempts decided at least RELEASE_AFTER_S ago."""
        due = self._to_release.get(partition)
        while due and due[0][0] <= now:
            self._release(partition, due.popleft()[1])

    def _expire_windows(self, partition: int, now: float) -> None:
        """Drop windows of attempts silent for longer than the TTL (no termination came), and
        of decided attempts whose release was forgotten (a restart, a rebalance)."""
        horizon = now - self.settings.window_ttl_s
        for key, window in self.cache.items(partition):
            decided = live_get(self.t.decided, key) is not None
            if decided and window.last_seen < now - RELEASE_AFTER_S:
                self._release(partition, key)
            elif window.last_seen < horizon and live_get(self.t.pending, key) is None:
                self.store.delete(key, self.cache.pop(partition, key))
                self.metrics.expired_windows.inc()

    def _expire_decisions(self, partition: int, now: float) -> None:
        """Forget decisions older than the TTL: they only guard against replays, which come
        minutes after a crash, not days."""
        horizon = now - self.settings.window_ttl_s
        self.memory.expire(partition, horizon)
        for key, value in live_items_of(self.t.decided, partition, self.settings.partitions):
            if orjson.loads(value)["decided_at"] < horizon:
                del self.t.decided[key]

    # ---------------------------------------------------------------- terminations
    async def _terminations(self, stream: Any) -> None:
        await bulk.consume(stream, self._working(self._terminations_batch), EVENTS_BATCH,
                           within_s=0.0)

    async def _terminations_batch(self, events: Sequence[Any]) -> None:
        events = await self._with_missing(events)
        ready: dict[str, _ToDecide] = {}
        log_end = _AskedOnce(self.offsets.end_offset, self.t.logs.get_topic_name(),
                             events[0].message.partition)
        for event in events:
            try:
                found = await self._on_job_event(event, log_end)
            except Exception as exc:  # noqa: BLE001 - one event never takes the batch
                log.exception("job event %s[%d]@%d failed", event.message.topic,
                              event.message.partition, event.message.offset)
                await self._dead_letter(
                    event, f"internal error: {type(exc).__name__}: {exc}", "invalid_field",
                    "terminations")
                continue
            if found is not None:
                job = found[0]
                ready[attempt_key(job.job_id, job.attempt)] = found
        if ready:
            await self._decide_at_termination(events[0].message.partition, ready)
        await self._finished(events)

    async def _on_job_event(self, event: Any, log_end: _AskedOnce[int | None]
                            ) -> _ToDecide | None:
        """Take a job event; a failed attempt whose log has ended is returned, to be decided
        with the batch (:meth:`_decide_at_termination`), any other is left pending with the
        end of its log partition (``log_end``, asked once per batch)."""
        job = await self._parsed(event, parse_job_event, "terminations")
        if job is None:
            return None
        self.metrics.job_events.labels(event=job.event, state=job.state or "").inc()
        self.reliability.observe(job, time.time())
        if job.event != "finished":
            return None
        key = attempt_key(job.job_id, job.attempt)
        if live_get(self.t.decided, key) or live_get(self.t.pending, key):
            return None  # a replay: the attempt is already being (or was) decided
        partition = event.message.partition
        self.in_partition(partition)
        if not job.failed:
            self._release(partition, key)
            return None
        # The broker's timestamp of the termination event starts the decision's clock.
        event_time = event.message.timestamp or time.time()
        offset = event.message.offset
        grace = self.settings.grace_period_s
        window = self.cache.get(partition, key)
        if grace <= 0 or (window is not None and window.eos):
            return _ToDecide(job, event_time, _log_window(job, window), offset)
        # The end of the job's log partition now: lines printed before the job ended lie below
        # it, and the decision waits until ingest has taken them (a backlog after a restart
        # can outlast the grace period). Asked of the broker: the consumer's own high-water
        # mark is stale for partitions paused by flow control. No answer in time: the
        # decision waits out the grace period only. One answer serves the whole batch: each
        # of its terminations was on the topic before the question was asked. (Asked for each
        # termination that came before ingest took its log's end-of-stream record, it was
        # 10-25 requests a second at 100 failures/s on the Kafka benchmark.)
        end = await log_end()
        # Ingest may have taken the end-of-stream record while we asked: it found no
        # pending termination then, so nobody else would ask for the decision before the
        # grace period ends (3 lone failures in 4 waited it out). No await from here to
        # the pending write, so ingest sees either this eos check or the pending entry.
        window = self.cache.get(partition, key)
        if window is not None and window.eos:
            return _ToDecide(job, event_time, _log_window(job, window), offset)
        self._write_pending(key, job, event_time, time.time() + grace, end, offset)
        return None

    def _write_pending(self, key: str, job: JobEvent, event_time: float, deadline: float,
                       log_end: int | None, offset: int | None) -> None:
        """Record a failed attempt to decide (read by :meth:`_decide` and the timer), with
        its termination's ``offset`` (whether an earlier owner may have decided it)."""
        self.t.pending[key] = orjson.dumps(
            {"event": job.to_dict(), "event_time": event_time, "deadline": deadline,
             "log_end": log_end, "offset": offset})

    async def _decide_at_termination(self, partition: int, ready: dict[str, _ToDecide]
                                     ) -> None:
        """Decide the failed attempts whose log had ended when their termination came, before
        the terminations are acknowledged: a crash replays them, so they need no pending
        entry (its write and deletion were two of a failure's changelog records). One not
        decided (the model failed, the broker refused its decision) is left pending, and
        the timer asks again (REQUEST_RETRY_S)."""
        try:
            await self._decide_todo(partition, ready, was_pending=False)
        except Exception:  # noqa: BLE001 - the attempts are left pending below
            log.exception("deciding %d attempts of partition %d at their termination "
                          "failed; they are left pending", len(ready), partition)
        self.in_partition(partition)
        now, mono = time.time(), time.monotonic()
        for key, (job, event_time, _, offset) in ready.items():
            if live_get(self.t.decided, key) is None:
                self._write_pending(key, job, event_time, now, None, offset)
                self._requested[key] = mono

    def _release(self, partition: int, key: str) -> None:
        """A completed (or cancelled) attempt needs no verdict: free its window."""
        self.store.delete(key, self.cache.pop(partition, key))

    async def _catch_up_stalled(self) -> None:
        """Process the records at the end of an owned partition that its agent never got
        (gaps.GapFiller.stalled): a hole followed by no record is found by no batch. Only
        time in which the agents could progress counts as a stall: not while the producer's
        buffer is full (faust holds every incoming message until it drains), nor across a
        check that came late (the event loop was held)."""
        app = self.t.app
        now = time.monotonic()
        late = now - self._stall_checked > 2 * STALL_CHECK_EVERY_S
        self._stall_checked = now
        buffer = app.producer.buffer
        if late or buffer.size >= buffer.max_messages:
            self.gaps.restart_clocks()
            return
        if app.rebalancing:
            return
        handlers = {self.t.logs.get_topic_name(): self._ingest_batch,
                    self.t.job_events.get_topic_name(): self._terminations_batch}
        owned: dict[str, list[int]] = {}
        for tp in sorted(app.assignor.assigned_actives()):
            if tp.topic in handlers:
                owned.setdefault(tp.topic, []).append(tp.partition)
        for topic, partitions in owned.items():
            # One request for the topic's partitions, not one each: the check runs every
            # STALL_CHECK_EVERY_S on every worker, busy or idle.
            ends = await self.offsets.end_offsets(topic, partitions) or {}
            for partition, end in ends.items():
                missing = await self.gaps.stalled(topic, partition, end)
                if missing:
                    self.metrics.refetched.labels(topic=topic).inc(len(missing))
                    await bulk.finish(handlers[topic](missing))

    async def _request_due_decisions(self) -> None:
        """Ask for the decisions whose grace period is over (also after a restart); free the
        windows of attempts decided RELEASE_AFTER_S ago (an idle partition has no batch
        that would)."""
        app = self.t.app
        if app.rebalancing:
            return
        for partition, due in list(self._to_release.items()):
            if due and due[0][0] <= time.time():
                self.in_partition(partition)
                self._release_decided(partition, time.time())
        assigned = app.assignor.assigned_actives()
        topic = self.t.job_events.get_topic_name()
        now, mono = time.time(), time.monotonic()
        for key, value in live_items(self.t.pending):
            job_id, attempt = split_key(key)
            partition = partition_of(job_id, self.settings.partitions)
            if TP(topic, partition) not in assigned:
                continue
            pending = orjson.loads(value)
            if pending["deadline"] > now:
                continue
            asked = self._requested.get(key)
            if asked is not None and mono - asked <= REQUEST_RETRY_S:
                continue
            # The catch-up wait counts from when this worker got the partition: after a
            # restart or a rebalance its backlog is new to it, however old the termination.
            owned_since = self._assigned_at.get(partition, 0.0)
            if not await self._logs_taken(job_id, pending.get("log_end")):
                waited = now - max(pending["deadline"], owned_since)
                if waited < CATCH_UP_LIMIT_S:
                    continue
                log.warning("deciding %s attempt %s before ingest took its log to the end "
                            "(%.0f s past its grace period): its window may be short",
                            job_id, attempt, waited)
            self._decide_soon(partition, key)

    async def _logs_taken(self, job_id: str, log_end: int | None) -> bool:
        """Has ingest taken every log record that was on the job's partition at its end?
        (When that end was not known, the partition's end now stands in for it.)"""
        partition = partition_of(job_id, self.settings.partitions)
        if log_end is None:
            log_end = await self.offsets.end_offset(self.t.logs.get_topic_name(), partition)
            if log_end is None:
                return False
        taken = self._ingested.get(partition)
        if taken is not None:
            return taken + 1 >= log_end
        # Nothing taken since this worker got the partition: was it all taken before?
        committed = await self.offsets.committed_offset(self.t.logs.get_topic_name(),
                                                        partition)
        return committed is not None and committed >= log_end

    # ---------------------------------------------------------------- decide
    def _decide_soon(self, partition: int, key: str) -> None:
        """Queue a pending attempt for its decision, made by the partition's decide task
        (started if there is none). In process, not through a topic: that hop cost a produce
        and a fetch per failure, and 7-23 ms of a lone failure's decision on an idle worker
        (docs/pipeline-bench.md, finding 20)."""
        self._requested[key] = time.monotonic()
        self._to_decide[partition][key] = None
        if partition not in self._deciders:
            self._deciders[partition] = asyncio.ensure_future(self._decide_queued(partition))

    async def _decide_queued(self, partition: int) -> None:
        """Decide the partition's queued attempts, a batch at a time (up to the
        micro-batcher's size; the batcher forms the model's batches across partitions),
        until none is left. A batch that fails stays pending: the timer asks again
        (REQUEST_RETRY_S)."""
        queued = self._to_decide[partition]
        try:
            while queued:
                keys = list(itertools.islice(queued, self.settings.batch_max_windows))
                for key in keys:
                    del queued[key]
                try:
                    await self._decide(partition, keys)
                except Exception:  # noqa: BLE001 - the attempts stay pending
                    log.exception("deciding %d attempts of partition %d failed; they stay "
                                  "pending and are asked for again", len(keys), partition)
        finally:
            # No await since the queue was found empty: a key queued now finds no task and
            # starts one.
            if self._deciders.get(partition) is asyncio.current_task():
                del self._deciders[partition]

    async def _decide(self, partition: int, keys: Sequence[str]) -> None:
        """Decide the pending attempts ``keys`` of ``partition``, as the pending table holds
        them; one decided meanwhile, or no longer pending, is skipped."""
        todo: dict[str, _ToDecide] = {}
        for key in keys:
            if live_get(self.t.decided, key) is not None:
                self._requested.pop(key, None)
                continue
            raw = live_get(self.t.pending, key)
            if raw is None:
                continue
            pending = orjson.loads(raw)
            job = JobEvent.from_dict(pending["event"])
            # An entry written before its termination's offset was kept (older workers) has
            # none: it counts as one an earlier owner may have decided.
            todo[key] = _ToDecide(job, pending["event_time"],
                                  _log_window(job, self.cache.get(partition, key)),
                                  pending.get("offset"))
        await self._decide_todo(partition, todo, was_pending=True)

    async def _decide_todo(self, partition: int, todo: dict[str, _ToDecide],
                           was_pending: bool) -> None:
        """Decide ``todo``'s attempts of ``partition`` (``was_pending``: from the pending
        table, which forgets each once it is decided); those not decided are left as they
        were."""
        now = time.time()
        self.in_partition(partition)
        self._release_decided(partition, now)
        if now - self._decisions_swept.get(partition, 0.0) > SWEEP_EVERY_S:
            self._decisions_swept[partition] = now
            self._expire_decisions(partition, now)
        todo = await self._not_on_topic(partition, todo, was_pending)
        if not todo:
            return
        taken_at = time.time()
        read = await self._classify([item.window for item in todo.values()])
        if read is None:
            return  # nothing decided: the timer asks again (REQUEST_RETRY_S)
        classified_at = time.time()
        version = self.classifier.version
        self.in_partition(partition)  # the memory's table writes go to the jobs' partition
        made = []
        for (key, (job, event_time, window, _)), (prediction, reading) in zip(
                todo.items(), read, strict=True):
            decision = self.memory.decide(job, window, prediction, reading, version,
                                          time.time(), event_time)
            if window.empty:  # the site's default policy then: worth an operator's look
                log.warning("%s: decided with no log line (none shipped, or none arrived "
                            "within the grace period and the wait for ingest): %s", key,
                            decision.action)
            value = decision.to_json()
            delivered = await self.t.decisions.send(key=job.job_id.encode(), value=value,
                                                    force=True)
            made.append((key, job, window, reading, decision, value, delivered))
        # Only what the broker holds is marked decided (see the module's docstring). A decision
        # it refused stays pending and is made again.
        outcomes = await asyncio.gather(*(d for *_, d in made), return_exceptions=True)
        published_at = time.time()
        done: list[Decided] = []
        for (key, job, window, reading, decision, value, _), outcome in zip(
                made, outcomes, strict=True):
            if isinstance(outcome, BaseException):
                log.warning("decision for %s not delivered (%r); it will be made again",
                            key, outcome)
                continue
            self._mark_decided(partition, key, job, value, was_pending)
            self.metrics.decisions.labels(verdict=decision.verdict, action=decision.action).inc()
            if decision.explored:
                self.metrics.explored.inc()
            self.metrics.decision_latency.observe(decision.latency_ms / 1000.0)
            event_time = todo[key].event_time
            self.metrics.waiting.observe(max(0.0, taken_at - event_time))
            self.metrics.classifying.observe(classified_at - taken_at)
            self.metrics.publishing.observe(published_at - classified_at)
            self.activity.on_decision(decision)
            done.append((window, decision, reading))
        for hook in self.decided_hooks if done else ():
            await hook(done)

    def latest_decision(self, job_id: str) -> bytes | None:
        """The decision of the job's latest decided attempt, as this worker holds it (``GET
        /decisions/{job_id}``). A job's attempts count up from 0, and the next exists only
        once the previous one failed, so its decided attempts end at the highest: found from
        the job's history (written as each failure is decided, before the decision is out:
        memory.py), looking past it (an attempt whose decision was adopted from the topic
        has no history) and below it (one whose decision is not out yet)."""
        history = self.memory.history(job_id)
        attempt = history[-1].attempt if history else 0
        while live_get(self.t.decided, attempt_key(job_id, attempt + 1)) is not None:
            attempt += 1
        for earlier in range(attempt, -1, -1):
            value = live_get(self.t.decided, attempt_key(job_id, earlier))
            if value is not None:
                return value
        return None

    def _mark_decided(self, partition: int, key: str, job: JobEvent, value: bytes,
                      was_pending: bool) -> None:
        """Record that the decisions topic holds the attempt's decision ``value``: replays
        skip it, its window is freed RELEASE_AFTER_S later."""
        self.in_partition(partition)
        self.t.decided[key] = value
        if was_pending:
            del self.t.pending[key]
        # Its window is not saved again: the mark reaches the changelog before any commit
        # that would save it, so a restart after that commit skips the attempt, and one
        # before it replays the records that built the window. A window decided within a
        # commit interval of its lines (most failures) is never written at all: 8 of the 14
        # changelog records a failure cost (docs/pipeline-bench.md, finding 14).
        self.cache.settled(partition, key)
        self._to_release[partition].append((time.time() + RELEASE_AFTER_S, key))
        self._requested.pop(key, None)

    async def _not_on_topic(self, partition: int, todo: dict[str, _ToDecide],
                            was_pending: bool) -> dict[str, _ToDecide]:
        """``todo`` less the attempts whose decision the decisions topic already holds
        (ledger.py): asked for those an earlier owner may have decided and for empty windows.
        Those are marked decided; when the topic cannot be read, the asked ones wait."""
        asked = {key: item.event_time for key, item in todo.items()
                 if item.window.empty or self._may_be_decided_elsewhere(partition, item)}
        if not asked:
            return todo
        found = await self.ledger.decided(partition, asked)
        if found is None:
            return {key: item for key, item in todo.items() if key not in asked}
        for key, value in found.items():
            job = todo.pop(key).job
            log.warning("%s: its decision is already on the decisions topic, though not in "
                        "this worker's decided table; adopted, not made again", key)
            self._mark_decided(partition, key, job, value, was_pending)
            self.metrics.adopted_decisions.inc()
        return todo

    def _may_be_decided_elsewhere(self, partition: int, item: _ToDecide) -> bool:
        """Whether an earlier owner of the partition (another worker, or this one before a
        restart) may have taken the attempt's termination, and so decided it: the decided
        table restored from the changelog can lack that decision (ledger.py)."""
        replays_end = self._replays_end.get(partition)
        if replays_end is None or item.offset is None:
            return time.time() - self._assigned_at.get(partition, 0.0) < LEDGER_CHECK_S
        return item.offset < replays_end

    async def _classify(self, windows: list[LogWindow]
                        ) -> list[tuple[Prediction | None, WindowReading]] | None:
        """A prediction per window (None for an empty one) and the reading of its text
        (reading.py). When the model fails on a batch, each window is tried alone, so one
        window the model cannot take costs only its own verdict: ``unknown`` (the scheduler's
        default policy), never a guess; its text is read here then. None when the model fails
        on every window (it is broken, not the windows): nothing is decided."""
        to_classify = [w for w in windows if not w.empty]
        try:
            found = iter(await self.batcher.submit_many(to_classify) if to_classify else [])
            return [(None, read_window(w)) if w.empty else next(found) for w in windows]
        except Exception:  # noqa: BLE001 - logged by the batcher; retried one by one below
            pass
        alone: list[tuple[Prediction | None, WindowReading]] = []
        failures = 0
        for window in windows:
            if window.empty:
                alone.append((None, read_window(window)))
                continue
            try:
                alone.append((await self.batcher.submit_many([window]))[0])
            except Exception:  # noqa: BLE001 - this window is decided unknown
                failures += 1
                alone.append((Prediction("unknown", 0.0, CLASSIFIER_ERROR_CATEGORY, []),
                              read_window(window)))
        if failures == len(to_classify):
            return None
        return alone


def _log_window(job: JobEvent, window: TailWindow | None) -> LogWindow:
    """What the model reads of an attempt: its window, or no line when none came."""
    if window is None:
        return LogWindow(job.job_id, job.attempt, [])
    return window.to_log_window(job.job_id, job.attempt)


def _close_model(loaded: Future[Classifier]) -> None:
    """Close a replaced model that has a ``close`` (a model process), in a thread: closing
    waits for the batch it may still be running."""
    if loaded.cancelled() or loaded.exception() is not None:
        return
    close = getattr(loaded.result(), "close", None)
    if close is not None:
        threading.Thread(target=close, name="sibylla-model-close", daemon=True).start()


def _loaded(classifier: Classifier) -> Future[Classifier]:
    """A model in hand, as the future :class:`Pipeline` keeps."""
    future: Future[Classifier] = Future()
    future.set_result(classifier)
    return future
