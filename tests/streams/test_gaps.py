"""Records the consumer skipped are read again; a batch finishes even when cancelled."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace

import pytest

from sibylla.streams.gaps import GapFiller, finish
from sibylla.streams.keys import partition_of
from sibylla.streams.ship import Shipper
from sibylla.streams.topics import ensure_topics
from tests.integration.fixtures import make_settings


async def test_a_batch_cancelled_midway_still_finishes_before_the_cancellation_goes_on() -> None:
    done: list[int] = []

    async def batch() -> None:
        for i in range(5):
            await asyncio.sleep(0.01)
            done.append(i)

    task = asyncio.create_task(finish(batch()))
    await asyncio.sleep(0.015)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert done == [0, 1, 2, 3, 4]


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
        gaps = GapFiller(settings, table)
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

