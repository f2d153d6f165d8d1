"""The decoded window cache rebuilds a partition's windows from the durable table and notes which
windows changed since they were saved."""

from __future__ import annotations

from sibylla.streams.keys import attempt_key, partition_of, split_key
from sibylla.streams.state import WindowCache, live_items, live_items_of
from sibylla.streams.window import TailWindow, WindowLimits
from sibylla.streams.window_store import WindowStore

LIMITS = WindowLimits(max_lines=10, max_bytes=1000, first_error_max_lines=3)
PARTITIONS = 4


def _store_with(jobs: list[str]) -> WindowStore:
    store = WindowStore({}, {}, LIMITS)
    for job in jobs:
        window = TailWindow(LIMITS)
        window.extend([f"{job} line"], now=1.0)
        store.save(attempt_key(job, 0), window)
    store.headers[b"0:deleted-job"] = None  # what changelog recovery leaves for a deletion
    return store


def test_after_a_restart_each_partition_finds_exactly_its_windows() -> None:
    jobs = [f"job-{i}" for i in range(40)]
    cache = WindowCache(_store_with(jobs), PARTITIONS)
    for job in jobs:
        window = cache.get(partition_of(job, PARTITIONS), attempt_key(job, 0))
        assert window is not None and list(window.tail) == [f"{job} line"]
    assert len(cache) == len(jobs)


def test_a_window_that_cannot_be_read_does_not_stop_its_partition(caplog) -> None:
    # A header damaged, or written by a newer release (a format this one does not know): the
    # partition's other windows load, and the attempt starts a new window.
    jobs = [f"job-{i}" for i in range(12)]
    store = _store_with(jobs)
    damaged = {jobs[0]: b"not json", jobs[1]: b'[99, "a header from the future"]'}
    for job, header in damaged.items():
        store.headers[attempt_key(job, 0)] = header
    cache = WindowCache(store, PARTITIONS)
    for job in jobs:
        window = cache.get(partition_of(job, PARTITIONS), attempt_key(job, 0))
        assert (window is None) == (job in damaged)
    fresh = cache.get_or_create(partition_of(jobs[1], PARTITIONS), attempt_key(jobs[1], 0))
    assert fresh.line_count == 0
    assert sum("cannot be read" in r.getMessage() for r in caplog.records) == 2


def test_a_revoked_partition_is_forgotten_and_reloaded_on_demand() -> None:
    cache = WindowCache(_store_with(["a", "b", "c"]), PARTITIONS)
    p = partition_of("a", PARTITIONS)
    cache.get_or_create(p, attempt_key("a", 0)).extend(["more"], now=2.0)
    cache.forget(p)
    assert list(cache.get(p, attempt_key("a", 0)).tail) == ["a line"]  # the durable copy


def test_changed_windows_are_handed_over_once_and_never_after_they_are_dropped() -> None:
    cache = WindowCache(_store_with([]), PARTITIONS)
    windows = {job: cache.get_or_create(0, attempt_key(job, 0)) for job in ("a", "b", "c")}
    cache.changed(0, {attempt_key(job, 0): w for job, w in windows.items()})
    cache.pop(0, attempt_key("b", 0))  # decided meanwhile: its window must not come back
    assert cache.partitions_changed() == [0]
    assert list(cache.take_changed(0)) == [attempt_key("a", 0), attempt_key("c", 0)]
    assert cache.take_changed(0) == {} and cache.partitions_changed() == []

    cache.changed(1, {attempt_key("d", 0): cache.get_or_create(1, attempt_key("d", 0))})
    cache.forget(1)  # revoked: the records behind the change are read again by the next owner
    assert cache.partitions_changed() == []


def test_keys_and_live_items() -> None:
    assert split_key(attempt_key("team:job#7", 3)) == ("team:job#7", 3)
    headers = _store_with(["x"]).headers
    assert [key for key, _ in live_items(headers)] == ["0:x"]
    assert all(0 <= partition_of(f"j{i}", 7) < 7 for i in range(100))


def test_partition_of_agrees_with_the_producers_partitioner() -> None:
    from aiokafka.partitioner import DefaultPartitioner

    partitioner = DefaultPartitioner()
    for i in range(200):
        job = f"llm-pretrain-{i}"
        assert partition_of(job, 12) == partitioner(job.encode(), list(range(12)),
                                                     list(range(12)))


def test_a_partitions_live_items_are_its_attempts_without_deletion_markers() -> None:
    table = {attempt_key(f"job-{i}", 0): f"v{i}".encode() for i in range(40)}
    table[attempt_key("job-gone", 0)] = None  # a deletion changelog recovery left behind
    mine = dict(live_items_of(table, 2, 4))
    assert mine == {k: v for k, v in table.items()
                    if v and partition_of(split_key(k)[0], 4) == 2}
    assert mine and len(mine) < 40
