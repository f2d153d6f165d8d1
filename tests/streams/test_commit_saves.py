"""The windows saved before an offset commit are written in their partition's event context,
whatever ingest does while the save lets it run."""

from __future__ import annotations

import asyncio
import gc
from pathlib import Path
from types import SimpleNamespace

from faust import current_event

from sibylla.settings import Settings
from sibylla.streams.agents import SAVE_YIELD_EVERY
from sibylla.streams.worker import build_worker


class _Event:
    """Stands for the faust event of a partition's last ingest batch (weakly referenced)."""


async def test_the_saves_keep_their_partitions_event_while_ingest_replaces_it(
        tmp_path: Path) -> None:
    """The save yields to the agents every SAVE_YIELD_EVERY windows; ingest then replaces the
    partition's context event. A save holding only a weak reference lost it, and the next
    table write raised "Cannot modify table key from outside of stream iteration", crashing
    the worker's commit (seen in a benchmark run on Apache Kafka: 250 windows a partition)."""
    settings = Settings.from_env({}, store="memory", data_dir=str(tmp_path))
    pipeline = build_worker(settings, SimpleNamespace(version="v0", predict=None))
    keys = [f"job-{i}:0" for i in range(SAVE_YIELD_EVERY + 50)]
    pipeline.cache.changed(0, {key: pipeline.cache.get_or_create(0, key) for key in keys})
    pipeline._context_event[0] = _Event()
    seen: list[bool] = []  # whether each save had an event (not the event: that would keep it)
    pipeline.store.save = (  # type: ignore[method-assign]
        lambda key, window: seen.append(isinstance(current_event(), _Event)))

    async def ingest_meanwhile() -> None:
        while len(seen) < SAVE_YIELD_EVERY:
            await asyncio.sleep(0)
        pipeline._context_event[0] = _Event()  # the next batch's event; the old one is freed
        gc.collect()

    await asyncio.gather(pipeline._save_windows(), ingest_meanwhile())
    assert len(seen) == len(keys)
    assert all(seen)
