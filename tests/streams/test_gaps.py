"""Records the consumer skipped are read again."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace

import pytest
from faust.types import TP

from sibylla.streams import gaps
from sibylla.streams.gaps import GapFiller
from sibylla.streams.keys import partition_of
from sibylla.streams.reread import PartitionReader
from sibylla.streams.ship import Shipper
from sibylla.streams.topics import ensure_topics
from sibylla.streams.worker import build_worker
from tests.integration.fixtures import make_settings


def _event(topic: str, partition: int, offset: int) -> SimpleNamespace:
    return SimpleNamespace(message=SimpleNamespace(topic=topic, partition=partition,
                                                   offset=offset))


@pytest.mark.integration
def test_records_between_the_last_finished_one_and_a_batch_are_read_again(
        broker, unique_prefix: str, tmp_path: Path) -> None:
    settings = make_settings(broker.bootstrap_servers, unique_prefix, tmp_path)
    topic = settings.topic("logs")

    async def scenario() -> tuple[list[int], list, list[int]]:
        await ensure_topics(settings)
        async with Shipper(settings) as shipper:
            for i in range(10):  # one job: one partition, offsets 0..9
                await shipper.send_raw(topic, b"job-gap", str(i).encode())
            await shipper.flush()
        partition = partition_of("job-gap", settings.partitions)
        table: dict[str, bytes] = {}
        gaps = GapFiller(PartitionReader(settings), table)
        first = await gaps.with_missing([_event(topic, partition, 0)])  # nothing finished yet
        gaps.mark([_event(topic, partition, 2)])
        batch = [_event(topic, partition, 7), _event(topic, partition, 8)]
        filled = await gaps.with_missing(batch)
        contiguous = await gaps.with_missing([_event(topic, partition, 3)])
        return ([e.message.offset for e in first],
                [(e.message.offset, getattr(e.message, "value", None)) for e in filled],
                [e.message.offset for e in contiguous])

    first, filled, contiguous = asyncio.run(scenario())
    assert first == [0]
    # 3..6 fetched from the broker (with their values), then the batch itself.
    assert filled == [(3, b"3"), (4, b"4"), (5, b"5"), (6, b"6"), (7, None), (8, None)]
    assert contiguous == [3]



@pytest.mark.integration
def test_records_at_the_end_of_a_partition_with_no_progress_are_read_again(
        broker, unique_prefix: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A hole at the end of a partition is followed by no record that would reveal it: after
    STALL_S without progress, the records past the last finished one are read again."""
    monkeypatch.setattr(gaps, "STALL_S", 0.2)
    settings = make_settings(broker.bootstrap_servers, unique_prefix, tmp_path)
    topic = settings.topic("logs")

    async def scenario() -> tuple[list, list, list]:
        await ensure_topics(settings)
        async with Shipper(settings) as shipper:
            for i in range(6):
                await shipper.send_raw(topic, b"job-tail", str(i).encode())
            await shipper.flush()
        partition = partition_of("job-tail", settings.partitions)
        table: dict[str, bytes] = {}
        filler = GapFiller(PartitionReader(settings), table)
        filler.mark([_event(topic, partition, 2)])  # 3..5 never delivered to the agent
        first = await filler.stalled(topic, partition, 6)  # starts the clock
        await asyncio.sleep(0.3)
        late = await filler.stalled(topic, partition, 6)
        filler.mark([_event(topic, partition, 5)])
        caught_up = await filler.stalled(topic, partition, 6)
        return first, [(e.message.offset, e.message.value) for e in late], caught_up

    first, late, caught_up = asyncio.run(scenario())
    assert first == [] and caught_up == []
    assert late == [(3, b"3"), (4, b"4"), (5, b"5")]


class _Reader:
    """Stands for the broker read of a stalled partition's records; counts the reads."""

    def __init__(self) -> None:
        self.reads = 0

    async def read_range(self, topic: str, partition: int, start: int, end: int) -> list:
        self.reads += 1
        return [SimpleNamespace(offset=o, key=None, value=b"", timestamp=0)
                for o in range(start, end)]


async def test_time_the_worker_could_not_progress_is_no_stall(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker held up (its loop blocked, its agents waiting for the producer to drain)
    makes no progress through no fault of the consumer: that time must not count, or every
    partition's queued records are read again on a worker already behind."""
    monkeypatch.setattr(gaps, "STALL_S", 0.2)
    reader = _Reader()
    filler = GapFiller(reader, {})  # type: ignore[arg-type]
    filler.mark([_event("logs", 0, 2)])
    assert await filler.stalled("logs", 0, 6) == []  # starts the clock
    await asyncio.sleep(0.3)
    filler.restart_clocks()  # the worker was held up meanwhile
    assert await filler.stalled("logs", 0, 6) == [] and reader.reads == 0
    await asyncio.sleep(0.3)  # now it could have progressed, and did not
    assert [e.message.offset for e in await filler.stalled("logs", 0, 6)] == [3, 4, 5]


async def test_the_stall_check_leaves_alone_a_partition_whose_agent_works_on_a_batch(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A batch may take long (a terminations batch waits for the decisions it makes): that
    is no stall, and its records must not be read again and handled a second time beside
    it. Once the batch ends, the partition needs STALL_S more without progress."""
    monkeypatch.setattr(gaps, "STALL_S", 0.2)
    reader = _Reader()
    filler = GapFiller(reader, {})  # type: ignore[arg-type]
    filler.mark([_event("job-events", 0, 2)])
    assert await filler.stalled("job-events", 0, 6) == []  # starts the clock
    with filler.working("job-events", 0):
        await asyncio.sleep(0.3)
        assert await filler.stalled("job-events", 0, 6) == [] and reader.reads == 0
    assert await filler.stalled("job-events", 0, 6) == [] and reader.reads == 0
    await asyncio.sleep(0.3)
    assert [e.message.offset for e in await filler.stalled("job-events", 0, 6)] == [3, 4, 5]


async def test_a_full_producer_buffer_or_a_late_check_restarts_the_stall_clocks(
        tmp_path: Path) -> None:
    settings = make_settings("127.0.0.1:9", "gaps-", tmp_path, store="memory")
    pipeline = build_worker(settings, SimpleNamespace(version="v0", predict=None))
    buffer = pipeline.t.app.producer.buffer
    clocks = pipeline.gaps._progress

    clocks[("logs", 0)] = (2, 0.0)  # no progress since long ago
    buffer.max_messages = 0  # full: every incoming message waits for it to drain
    await pipeline._catch_up_stalled()
    assert clocks == {}, "a full buffer held the agents: no stall"

    clocks[("logs", 0)] = (2, 0.0)
    buffer.max_messages = 10**9
    pipeline._stall_checked -= 60  # the timer came a minute late: the loop was held
    await pipeline._catch_up_stalled()
    assert clocks == {}, "a held loop held the agents: no stall"


async def test_the_stall_check_asks_each_topic_once_and_hands_on_what_was_missed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every 2 s, on every worker: the ends of a topic's owned partitions come in one
    request, and a stalled partition's missed records go to that topic's agent."""
    settings = make_settings("127.0.0.1:9", "gaps-", tmp_path, store="memory")
    pipeline = build_worker(settings, SimpleNamespace(version="v0", predict=None))
    logs, events = pipeline.t.logs.get_topic_name(), pipeline.t.job_events.get_topic_name()
    owned = {TP(topic, p) for topic in (logs, events, "other") for p in (0, 1)}
    monkeypatch.setattr(pipeline.t.app.assignor, "assigned_actives", lambda: owned)
    asked: list[tuple[str, list[int]]] = []

    async def ends(topic: str, partitions: list[int]) -> dict[int, int]:
        asked.append((topic, sorted(partitions)))
        return dict.fromkeys(partitions, 9)

    async def stalled(topic: str, partition: int, end: int) -> list[str]:
        return [f"{topic}/{partition}@{end}"] if partition == 1 else []

    handled: list[tuple[str, list[str]]] = []

    async def handler_of(name: str, records: list[str]) -> None:
        handled.append((name, records))

    monkeypatch.setattr(pipeline.offsets, "end_offsets", ends)
    monkeypatch.setattr(pipeline.gaps, "stalled", stalled)
    monkeypatch.setattr(pipeline, "_ingest_batch", lambda r: handler_of("ingest", r))
    monkeypatch.setattr(pipeline, "_terminations_batch", lambda r: handler_of("terminations", r))
    await pipeline._catch_up_stalled()
    assert sorted(asked) == sorted([(logs, [0, 1]), (events, [0, 1])])
    assert sorted(handled) == [("ingest", [f"{logs}/1@9"]),
                               ("terminations", [f"{events}/1@9"])]
