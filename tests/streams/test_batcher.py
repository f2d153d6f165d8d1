"""The micro-batcher groups concurrent requests and keeps each caller's results in order."""

from __future__ import annotations

import asyncio
import threading

import pytest

from sibylla.streams.batcher import MicroBatcher


async def test_concurrent_callers_share_batches_and_get_their_own_results() -> None:
    batches: list[int] = []
    loop_thread = threading.get_ident()
    threads: set[int] = set()

    def square(items):
        threads.add(threading.get_ident())
        batches.append(len(items))
        return [i * i for i in items]

    batcher = MicroBatcher(square, max_batch=8, max_wait_s=0.05)
    results = await asyncio.gather(*(batcher.submit_many([i, i + 100]) for i in range(10)))
    await batcher.close()
    assert results == [[i * i, (i + 100) ** 2] for i in range(10)]
    assert sum(batches) == 20 and max(batches) <= 8 and len(batches) < 20
    assert loop_thread not in threads, "the model must not run on the event loop's thread"


async def test_a_failing_batch_fails_its_callers_and_the_next_batch_still_runs() -> None:
    calls = 0

    def flaky(items):
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("CUDA error: device-side assert")
        return list(items)

    batcher = MicroBatcher(flaky, max_batch=4, max_wait_s=0.0)
    with pytest.raises(RuntimeError, match="device-side"):
        await batcher.submit_many([1])
    assert await batcher.submit_many([2, 3]) == [2, 3]
    await batcher.close()
