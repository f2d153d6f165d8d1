"""The windows a worker holds, in memory, in front of the changelog-backed table.

The faust table is the durable copy (its changelog survives a crash, its store a restart);
decoding a window from it on every batch would cost more than the ingest itself, so the live
windows of the partitions this worker owns stay decoded here. Windows are grouped by partition
so a rebalance can drop exactly the ones that moved away.

Ingest changes a window in memory and notes it (:meth:`WindowCache.changed`); the changed
windows' headers are saved together before faust commits the offsets of the records that
changed them (agents.py), not after every batch: with one-line records from many jobs a batch
touches nearly as many windows as it holds records, and a header per touched window was a
changelog record per line. (Their lines are written as they fill chunks, window_store.py,
except those of a log that has ended, which wait for the commit; and a window whose attempt
is decided by then is not saved at all: :meth:`WindowCache.settled`.)
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

from faust.tables.base import Collection

from sibylla.streams.keys import key_text, partition_of, split_key
from sibylla.streams.window import TailWindow
from sibylla.streams.window_store import WindowStore

log = logging.getLogger(__name__)

__all__ = ["WindowCache", "live_get", "live_items", "live_items_of"]


def live_get(table: Any, key: str) -> bytes | None:
    """A table's value for ``key``, or None when absent or deleted. After changelog recovery
    a deletion can linger as a non-bytes value that ``in`` and ``get`` still report.

    Read from the table's store, not through the table: faust's ``Table.get`` asks the store
    whether it holds the key and then reads it, each through the table's per-read hooks (two
    RocksDB reads for a key that is there); these reads were ~9% of the event loop's samples
    at 100 failures/s. The store reads the current event's partition either way. Any other
    mapping is read as it is."""
    try:
        value = table.data[key] if isinstance(table, Collection) else table[key]
    except KeyError:
        return None
    return value if isinstance(value, bytes) and value else None


def live_items(table: Any) -> Iterator[tuple[str, bytes]]:
    """A table's (key, value) pairs, skipping deletions that changelog recovery leaves behind
    as non-bytes values."""
    for key, value in list(table.items()):
        if isinstance(value, bytes) and value:
            yield key_text(key), value


def live_items_of(table: Any, partition: int, partitions: int) -> Iterator[tuple[str, bytes]]:
    """The live items of one partition's attempts (attempt keys). Keys are filtered before any
    value is read: with the RocksDB store each value is a read, and sweeps run per partition."""
    for raw_key in list(table.keys()):
        key = key_text(raw_key)
        if partition_of(split_key(key)[0], partitions) == partition:
            value = table.get(raw_key)
            if isinstance(value, bytes) and value:
                yield key, value


class WindowCache:
    """Decoded windows by partition, loaded lazily from the durable table."""

    def __init__(self, store: WindowStore, partitions: int) -> None:
        self.store = store
        self.partitions = partitions
        self._by_partition: dict[int, dict[str, TailWindow]] = {}
        self._changed: dict[int, dict[str, TailWindow]] = {}  # not saved since they changed

    def _part(self, partition: int) -> dict[str, TailWindow]:
        part = self._by_partition.get(partition)
        if part is None:
            part = self._by_partition[partition] = self._load(partition)
        return part

    def _load(self, partition: int) -> dict[str, TailWindow]:
        """Windows of ``partition`` that the table holds (after a restart or a rebalance).

        A window that cannot be read (a damaged header, or one a newer release wrote) is left
        out with a warning: its attempt starts a new window, and one such window never stops
        the partition's ingest and decisions, which every later batch would crash again."""
        windows: dict[str, TailWindow] = {}
        for key, header in live_items_of(self.store.headers, partition, self.partitions):
            try:
                windows[key] = self.store.load(key, header)
            except Exception as exc:  # noqa: BLE001 - whatever the stored bytes hold
                log.warning("window %s cannot be read, its lines so far are lost: %s: %s",
                            key, type(exc).__name__, exc)
        return windows

    def get(self, partition: int, key: str) -> TailWindow | None:
        return self._part(partition).get(key)

    def get_or_create(self, partition: int, key: str) -> TailWindow:
        part = self._part(partition)
        window = part.get(key)
        if window is None:
            window = part[key] = TailWindow(self.store.limits)
        return window

    def pop(self, partition: int, key: str) -> TailWindow | None:
        """Remove a window (its attempt was decided, completed or expired); a change not
        saved yet is dropped with it."""
        self._changed.get(partition, {}).pop(key, None)
        return self._part(partition).pop(key, None)

    def holds(self, partition: int, key: str, window: TailWindow) -> bool:
        """Whether ``window`` is still the one held for ``key`` (never loads a partition)."""
        return self._by_partition.get(partition, {}).get(key) is window

    def changed(self, partition: int, windows: dict[str, TailWindow]) -> None:
        """Note windows ingest changed; :meth:`take_changed` hands them to be saved."""
        self._changed.setdefault(partition, {}).update(windows)

    def settled(self, partition: int, key: str) -> None:
        """The attempt of ``key`` is decided: its window is only to be freed, not saved."""
        self._changed.get(partition, {}).pop(key, None)

    def take_changed(self, partition: int) -> dict[str, TailWindow]:
        """The windows of ``partition`` changed since the last call, by key."""
        return self._changed.pop(partition, {})

    def partitions_changed(self) -> list[int]:
        return [p for p, windows in self._changed.items() if windows]

    def items(self, partition: int) -> Iterator[tuple[str, TailWindow]]:
        return iter(list(self._part(partition).items()))

    def forget(self, partition: int) -> None:
        """Drop a partition this worker no longer owns (its table copy stays durable). Changes
        not saved yet go too: they came from records after the last commit (each commit saves
        first), which the partition's next owner reads again."""
        self._changed.pop(partition, None)
        self._by_partition.pop(partition, None)

    def __len__(self) -> int:
        return sum(len(p) for p in self._by_partition.values())

    def text_bytes(self) -> int:
        return sum(w.memory_bytes for p in self._by_partition.values() for w in p.values())
