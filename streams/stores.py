"""faust's table stores, with what a worker needs changed.

:class:`Store`: faust's RocksDB store without a full garbage collection per table per
rebalance, and with buffers sized for many small databases (:data:`OPTIONS`).

faust's ``rocksdb.Store.revoke_partitions`` runs ``gc.collect()`` every time, for every table,
whether or not it closed a database: its purpose is to free the handles of the databases it
dropped, so that the same partition can be opened again (RocksDB locks a database per
process). With torch loaded a collection takes 0.15-0.25 s of CPU on the project's box, and a
worker has 8 tables: about 2 s of the event loop at start-up (the first assignment revokes the
empty set), and again at every rebalance, while the worker owns no partitions yet or has just
been given them. (Seen in a py-spy profile of a worker start: 532 of 2,428 samples.)

:class:`Store` collects only when it dropped a database, which keeps what the collection is
for. It is registered as the ``sibylla`` store (``sibylla://``), chosen by ``app.build_app``.

:class:`MemoryStore`: faust's in-memory store, keyed as the worker writes. A worker's tables
declare ``bytes`` keys (their changelogs keep keys raw) and are written with ``str`` keys; the
RocksDB store encodes either to the same bytes, but faust's memory store keeps whatever it is
given: str keys from the worker's writes, bytes keys from changelog recovery. A worker that
took a partition over then looked up str keys among bytes ones and found nothing: its pending
decisions were never made (the timer saw them, the decide agent did not) and its windows lost
their completed chunks. Seen as decisions missing for two minutes when a second worker joined
while the first had terminations pending. It is the ``sibylla-memory`` store.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterable
from typing import Any

from faust.stores import STORES, memory, rocksdb

from sibylla.streams.keys import key_text

__all__ = ["MEMORY_SCHEME", "SCHEME", "MemoryStore", "Store"]

SCHEME = "sibylla"
MEMORY_SCHEME = "sibylla-memory"


# faust opens every table partition's database with 64 MiB write buffers (three of them) and a
# 2 GiB block cache. A worker has 8 tables x its partitions' databases, and a window's writes
# sat in those write buffers beside the window itself: with 10,000 windows of 200 lines the
# worker grew 597 MiB over its serving RSS, 427 MiB with these (bench_pipeline --phases memory,
# same box; ingest CPU per line unchanged). Reads are few (windows are decoded once, cached).
OPTIONS = {"write_buffer_size": 4 << 20, "max_write_buffer_number": 2,
           "block_cache_size": 8 << 20, "block_cache_compressed_size": 8 << 20}


class Store(rocksdb.Store):
    """faust's RocksDB store; see the module docstring for the two differences."""

    def __init__(self, *args: Any, options: Any = None, **kwargs: Any) -> None:
        super().__init__(*args, options={**OPTIONS, **(options or {})}, **kwargs)

    def revoke_partitions(self, table: Any, tps: Any) -> None:
        dropped = False
        for tp in tps:
            if tp.topic in table.changelog_topic.topics:
                db = self._dbs.pop(tp.partition, None)
                if db is not None:
                    dropped = True
                    self.logger.info(f"closing db {tp.topic} partition {tp.partition}")
        if dropped:
            gc.collect()  # frees the dropped handles so that the partition can reopen


class MemoryStore(memory.Store):
    """faust's memory store, its recovered keys as text (see the module docstring)."""

    def apply_changelog_batch(self, batch: Iterable[Any], to_key: Callable[[Any], Any],
                              to_value: Callable[[Any], Any]) -> None:
        super().apply_changelog_batch(batch, lambda key: key_text(to_key(key)), to_value)


STORES.aliases[SCHEME] = f"{__name__}:Store"
STORES.aliases[MEMORY_SCHEME] = f"{__name__}:MemoryStore"
