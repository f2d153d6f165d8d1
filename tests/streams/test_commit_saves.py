"""The windows saved before an offset commit: written in their partition's event context,
whatever ingest does while the save lets it run, and only those whose attempt is undecided."""

from __future__ import annotations

import asyncio
import dataclasses
import gc
from pathlib import Path
from types import SimpleNamespace

from faust import current_event
from faust.types import TP

from sibylla.schemas.records import JobEvent
from sibylla.settings import Settings
from sibylla.streams.agents import SAVE_YIELD_EVERY
from sibylla.streams.worker import build_worker


def _partition_of_current_event() -> int | None:
    event = current_event()
    return None if event is None else event.message.partition


async def test_the_saves_keep_their_partitions_event_while_the_partition_is_revoked(
        tmp_path: Path) -> None:
    """The save yields to the agents every SAVE_YIELD_EVERY windows; a revocation then drops
    the event standing for the partition. A save holding only a weak reference lost it, and
    the next table write raised "Cannot modify table key from outside of stream iteration",
    crashing the worker's commit (seen in a benchmark run on Apache Kafka, when ingest
    replaced the event the save borrowed: 250 windows a partition)."""
    settings = Settings.from_env({}, store="memory", data_dir=str(tmp_path))
    pipeline = build_worker(settings, SimpleNamespace(version="v0", predict=None))
    keys = [f"job-{i}:0" for i in range(SAVE_YIELD_EVERY + 50)]
    pipeline.cache.changed(3, {key: pipeline.cache.get_or_create(3, key) for key in keys})
    seen: list[int | None] = []  # the partition each save wrote to
    pipeline.store.save = (  # type: ignore[method-assign]
        lambda key, window: seen.append(_partition_of_current_event()))

    async def revoked_meanwhile() -> None:
        while len(seen) < SAVE_YIELD_EVERY:
            await asyncio.sleep(0)
        pipeline._partition_events.clear()
        gc.collect()

    await asyncio.gather(pipeline._save_windows(), revoked_meanwhile())
    assert seen == [3] * len(keys)


async def test_a_window_decided_before_the_commit_is_not_written(tmp_path: Path) -> None:
    """A failure whose log ended and was decided within a commit interval needs its window
    no more: the decided mark reaches the changelog before that commit, and a crash before it
    replays the records. Written anyway, each such window cost its lines, a header and their
    deletions 5 s later (8 of the 14 changelog records of a failure in the benchmark). A job
    still running has its lines saved: a restart after the commit rebuilds its window."""
    settings = Settings.from_env({}, store="memory", data_dir=str(tmp_path))
    pipeline = build_worker(settings, SimpleNamespace(version="v0", predict=None))
    running, failed = "job-running:0", "job-failed:0"
    for key in (running, failed):
        pipeline.cache.get_or_create(0, key).extend([f"step {i} loss 0.1" for i in range(80)],
                                                    0.0)
    pipeline.cache.changed(0, {key: pipeline.cache.get(0, key) for key in (running, failed)})
    # The decision's own table writes, without a broker: plain dicts stand for the tables.
    pipeline.t = dataclasses.replace(pipeline.t, decided={},
                                     pending={failed: b"{}"})
    pipeline._mark_decided(0, failed, JobEvent("job-failed", 0, "finished", "FAILED"),
                           b"{}", was_pending=True)
    saved: list[str] = []
    pipeline.store.save = lambda key, window: saved.append(key)  # type: ignore[method-assign]

    await pipeline._save_windows()

    assert saved == [running]
    assert pipeline.t.decided == {failed: b"{}"} and pipeline.t.pending == {}


class _WritesWithPartition(dict):
    """A table that records the partition of the event each write happened in."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[tuple[str, bytes, int | None]] = []

    def __setitem__(self, key: str, value: bytes) -> None:
        self.writes.append((key, value, _partition_of_current_event()))
        super().__setitem__(key, value)


def _finished_batch(topic: str, partition: int, last_offset: int) -> list[SimpleNamespace]:
    return [SimpleNamespace(message=SimpleNamespace(topic=topic, partition=partition,
                                                    offset=last_offset))]


async def test_finished_batches_reach_the_offsets_table_at_the_commit(tmp_path: Path) -> None:
    """The last finished offset of each agent's partition (gaps.py) is what a successor
    resumes its gap checks from, so it must be on the changelog before the offsets it covers
    are committed, in its partition's event context. Written per batch, it was 1.3-1.6
    changelog records per failure; now one per partition and topic per commit. A revoked
    partition's unwritten marks are not this worker's to write any more."""
    settings = Settings.from_env({}, store="memory", data_dir=str(tmp_path))
    pipeline = build_worker(settings, SimpleNamespace(version="v0", predict=None))
    table = pipeline.gaps.table = _WritesWithPartition()
    logs, events = pipeline.t.logs.get_topic_name(), pipeline.t.job_events.get_topic_name()

    for batch in (_finished_batch(logs, 1, 5), _finished_batch(logs, 1, 9),
                  _finished_batch(events, 2, 3), _finished_batch(logs, 1, 7)):
        await pipeline._finished(batch)
    assert table.writes == [], "nothing written per batch"
    assert pipeline.gaps.done(logs, 1) == 9 and pipeline.gaps.done(events, 2) == 3

    await pipeline._save_marks()
    assert sorted(table.writes) == [(f"{events}/2", b"3", 2), (f"{logs}/1", b"9", 1)]
    await pipeline._save_marks()
    assert len(table.writes) == 2, "a commit with no batch finished writes nothing"

    await pipeline._finished(_finished_batch(logs, 1, 12))
    await pipeline._on_revoked(pipeline.t.app, {TP(logs, 1)})
    await pipeline._save_marks()
    assert len(table.writes) == 2 and pipeline.gaps.done(logs, 1) == 9
