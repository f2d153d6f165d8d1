"""A worker that takes a partition over rebuilds its tables from their changelogs: whatever the
store, it must then find the pending decisions and the windows the previous owner wrote."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest
from faust.types import TP

from sibylla.settings import Settings
from sibylla.streams.app import build_app
from sibylla.streams.keys import attempt_key, partition_of
from sibylla.streams.state import live_get, live_items
from sibylla.streams.window import BLOCK_LINES, TailWindow, WindowLimits
from sibylla.streams.window_store import WindowStore

LIMITS = WindowLimits(max_lines=4 * BLOCK_LINES, max_bytes=1 << 20, first_error_max_lines=8)


@dataclass
class _Message:
    tp: TP
    offset: int
    key: bytes
    value: bytes | None

    @property
    def partition(self) -> int:
        return self.tp.partition


@dataclass
class _ChangelogRecord:
    """A changelog record as faust's recovery hands it to a store: the key as its raw bytes."""

    key: bytes
    value: bytes | None
    message: _Message


def _recover(table: Any, written: dict[str, bytes | None], partitions: int) -> None:
    """Replay ``written`` (what the previous owner wrote, None for a deletion) into ``table``
    as changelog recovery does."""
    topic = table.changelog_topic.get_topic_name()
    table.apply_changelog_batch([
        _ChangelogRecord(key.encode(), value, _Message(
            TP(topic, partition_of(key.split("#")[0].split(":", 1)[-1], partitions)), offset,
            key.encode(), value))
        for offset, (key, value) in enumerate(written.items())])


@pytest.mark.parametrize("store", ["memory", "rocksdb"])
def test_a_worker_taking_a_partition_over_finds_its_pending_decisions_and_whole_windows(
        store: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    settings = Settings(store=store, data_dir=tmp_path, partitions=4)
    t = build_app(settings)
    # The group gave this worker every partition (the RocksDB store lists only those).
    owned = {TP(table.changelog_topic.get_topic_name(), p)
             for table in (t.pending, t.windows, t.window_chunks)
             for p in range(settings.partitions)}
    monkeypatch.setattr(t.app.assignor, "assigned_actives", lambda: owned)
    key = attempt_key("job-7", 0)
    pending = orjson.dumps({"event": {"job_id": "job-7"}, "deadline": 0.0})
    # What the previous owner wrote: a window longer than a chunk, and the pending decision.
    headers: dict[str, bytes | None] = {}
    chunks: dict[str, bytes | None] = {}
    window = TailWindow(LIMITS)
    lines = [f"step {i}" for i in range(3 * BLOCK_LINES + 5)]
    window.extend(lines, now=1.0)
    WindowStore(headers, chunks, LIMITS).save(key, window)
    headers["0:gone-job"] = None  # a deletion

    _recover(t.pending, {key: pending}, settings.partitions)
    _recover(t.windows, headers, settings.partitions)
    _recover(t.window_chunks, chunks, settings.partitions)

    assert live_get(t.pending, key) == pending  # the decide agent finds what the timer asks
    assert [k for k, _ in live_items(t.pending)] == [key]
    restored = WindowStore(t.windows, t.window_chunks, LIMITS).load(key, live_get(t.windows, key))
    assert list(restored.tail) == lines[-restored.tail_len:]
    assert restored.line_count == len(lines)
    assert live_get(t.windows, "0:gone-job") is None

