"""Windows persisted incrementally come back exactly, and the store stays bounded."""

from __future__ import annotations

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from sibylla.streams.window import TailWindow, WindowLimits
from sibylla.streams.window_store import SEGMENT_CHUNKS, WindowStore

LINE = st.text(max_size=60).map(lambda s: s.replace("\n", " "))
CHUNKS = st.lists(st.lists(LINE, max_size=40), min_size=1, max_size=12)
# Blocks (the store's chunks) of a few lines, so that small windows have many.
LIMITS = st.builds(WindowLimits, max_lines=st.integers(1, 40),
                   max_bytes=st.integers(256, 2048), first_error_max_lines=st.integers(0, 6),
                   block_lines=st.integers(1, 8))


def _store(limits: WindowLimits) -> WindowStore:
    return WindowStore({}, {}, limits)


@settings(max_examples=300, deadline=None)
@given(limits=LIMITS, batches=CHUNKS,
       saves=st.lists(st.sampled_from([None, 1, SEGMENT_CHUNKS, "all"]), min_size=12,
                      max_size=12), eos_from=st.integers(0, 12))
def test_a_saved_window_loads_back_as_it_was(limits, batches, saves, eos_from) -> None:
    # Between saves (the worker saves at each commit), ingest writes the chunks completed
    # (save_chunks) once there are at least 1 or SEGMENT_CHUNKS of them. From batch
    # ``eos_from`` on, the log has ended (the store then leaves its lines uncompressed), and
    # lines may still come after the marker.
    store = _store(limits)
    window = TailWindow(limits)
    for i, (batch, save) in enumerate(zip(batches, saves, strict=False)):
        window.extend(batch + ([] if i else ["Traceback (most recent call last):"]), now=i)
        window.last_offset = i
        window.eos = i >= eos_from
        if save == "all" or i == len(batches) - 1:
            store.save("0:job", window)
        elif save is not None:
            store.save_chunks("0:job", window, save)
    again = store.load("0:job", store.headers["0:job"])
    assert list(again.tail) == list(window.tail)
    assert again.first_error == window.first_error
    assert (again.line_count, again.last_offset) == (window.line_count, window.last_offset)
    # Only chunks that still hold tail lines are kept.
    assert len(store.chunks) <= limits.max_lines // limits.block_lines + 2
    # The restored window goes on exactly like the original.
    for w in (window, again):
        w.extend(["after restart"], now=99.0)
        store.save("0:job", w)
    assert list(store.load("0:job", store.headers["0:job"]).tail) == list(window.tail)


def test_saving_writes_only_what_changed() -> None:
    """One more line costs one small header, not a window's worth of changelog."""
    limits = WindowLimits(max_lines=256, max_bytes=1 << 20, first_error_max_lines=4)
    writes: list[int] = []

    class Recording(dict):
        def __setitem__(self, key, value):
            writes.append(len(value))
            super().__setitem__(key, value)

    headers: dict[str, bytes] = {}
    store = WindowStore(headers, Recording(), limits)
    window = TailWindow(limits)
    window.extend([f"step {i} loss 0.{i:04d} " + "x" * 60 for i in range(250)], now=0.0)
    store.save("0:j", window)
    writes.clear()
    window.extend(["one more line"], now=1.0)
    store.save("0:j", window)
    assert writes == []  # no chunk: the new line fills the open chunk, kept in the header
    assert len(headers["0:j"]) < limits.block_lines * 100


def test_deleting_a_window_removes_its_header_and_chunks() -> None:
    limits = WindowLimits(max_lines=50, max_bytes=10_000, first_error_max_lines=2, block_lines=4)
    store = _store(limits)
    window = TailWindow(limits)
    window.extend([f"line {i}" for i in range(120)], now=0.0)
    store.save("3:job", window)
    store.delete("3:job", window)
    assert store.headers == {} and store.chunks == {}


@settings(max_examples=300, deadline=None)
@given(limits=LIMITS, batches=CHUNKS, restarts=st.lists(st.booleans(), min_size=12, max_size=12))
def test_a_window_restored_again_and_again_goes_on_like_one_never_restored(
        limits, batches, restarts) -> None:
    # A worker killed between batches restores the window from the store each time (its
    # compressed blocks then start at other lines than the live window's).
    store = _store(limits)
    live, restored = TailWindow(limits), TailWindow(limits)
    for i, (batch, restart) in enumerate(zip(batches, restarts, strict=False)):
        for w in (live, restored):
            w.extend(batch, now=i)
        store.save("0:job", restored)
        if restart:
            restored = store.load("0:job", store.headers["0:job"])
        assert restored.tail == live.tail
        assert restored.line_count == live.line_count
        assert restored.tail_bytes == live.tail_bytes


def test_a_logbatch_record_of_many_chunks_is_saved_in_a_few_records() -> None:
    """A shipper's LogBatch of 250 lines completes 7 chunks of 32 lines: they reach the
    changelog as one record, compressed, not seven."""
    limits = WindowLimits(max_lines=256, max_bytes=1 << 20, first_error_max_lines=4)
    writes: list[str] = []

    class Recording(dict):
        def __setitem__(self, key, value):
            writes.append(key)
            super().__setitem__(key, value)

    store = WindowStore({}, Recording(), limits)
    window = TailWindow(limits)
    lines = [f"step {i} loss 0.{i:04d}" for i in range(250)]
    window.extend(lines, now=0.0)
    store.save("0:j", window)
    assert SEGMENT_CHUNKS == 8 and writes == ["0:j#b0"]
    assert sum(map(len, store.chunks.values())) < len("".join(lines[:224])) / 2
    assert list(store.load("0:j", store.headers["0:j"]).tail) == list(window.tail)


@settings(max_examples=300, deadline=None)
@given(limits=LIMITS, batches=CHUNKS, crash_after=st.integers(0, 11), merged=st.booleans())
def test_a_replay_after_a_crash_leaves_no_chunk_behind(limits, batches, crash_after,
                                                       merged) -> None:
    # A worker saves a few batches, then dies before its consumer offset moved: the next one
    # restores the window from the header it last committed with and takes the same records
    # again, maybe in one batch (segments then start at other chunks than before the crash).
    store = _store(limits)
    live = TailWindow(limits)
    committed = None
    for i, batch in enumerate(batches):
        live.extend(batch, now=i)
        store.save("0:job", live)
        if i == min(crash_after, len(batches) - 1):
            committed = (i, store.headers["0:job"])
    assert committed is not None
    done, header = committed
    again = store.load("0:job", header)
    replay = batches[done + 1:]
    for batch in ([[line for b in replay for line in b]] if merged and replay else replay):
        again.extend(batch, now=0)
        store.save("0:job", again)
    assert again.tail == live.tail
    assert store.load("0:job", store.headers["0:job"]).tail == live.tail
    store.delete("0:job", again)
    assert store.headers == {} and store.chunks == {}


def test_windows_saved_by_earlier_formats_load_and_their_chunks_are_replaced() -> None:
    """A worker upgraded over a store written by an earlier release (format 1: a record per
    chunk of half a block, as JSON, the header lists none) reads its windows. Their next save
    writes the tail again as compressed blocks; the old chunks go at the save after it (a
    commit came between: the new header is on the changelog) or with the window."""
    limits = WindowLimits(max_lines=50, max_bytes=10_000, first_error_max_lines=2, block_lines=8)
    lines = [f"line {i}" for i in range(42)]
    chunks = {f"0:job#{n}": orjson.dumps([4 * n, lines[4 * n:4 * n + 4]]) for n in range(10)}
    headers = {"0:job": orjson.dumps([1, 42, 42, 5.0, False, 0, 7, [], 40, lines[40:]])}
    store = WindowStore(headers, chunks, limits)
    window = store.load("0:job", headers["0:job"])
    assert window.tail == lines and window.last_offset == 7
    window.extend([f"more {i}" for i in range(3)], now=6.0)
    store.save("0:job", window)
    assert "0:job#0" in chunks, "the header on the changelog may still list it"
    assert store.load("0:job", headers["0:job"]).tail == window.tail
    window.extend(["one more"], now=7.0)
    store.save("0:job", window)
    assert not [k for k in chunks if "#b" not in k]
    assert store.load("0:job", headers["0:job"]).tail == window.tail
    store.delete("0:job", window)
    assert headers == {} and chunks == {}

    # Deleted before its next save: the old chunks go with it.
    chunks.update({f"1:job#{n}": orjson.dumps([4 * n, lines[4 * n:4 * n + 4]])
                   for n in range(10)})
    headers["1:job"] = orjson.dumps([1, 42, 42, 5.0, False, 0, 7, [], 40, lines[40:]])
    store.delete("1:job", store.load("1:job", headers["1:job"]))
    assert headers == {} and chunks == {}
