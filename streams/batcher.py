"""Micro-batching of classification requests.

Windows arrive one failed job at a time, from several partition actors; the model is far
cheaper per window in a batch (one padded kernel launch instead of many). The batcher runs the
blocking ``predict`` in a worker thread so the event loop keeps consuming meanwhile, one batch
at a time, and a batch is whatever queued while the previous one ran (up to ``max_batch``):
under load batches grow by themselves, and a lone window on an idle model runs at once instead
of waiting for company that is not coming (a fixed wait after the first window added up to
``max_wait_s`` to every lone failure's decision). ``max_wait_s`` > 0 restores a wait for the
batch to fill, counted from its first window, for a model that gains more from full batches
than the wait costs (a GPU at high rates).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Generic, TypeVar

__all__ = ["MicroBatcher"]

log = logging.getLogger(__name__)

In = TypeVar("In")
Out = TypeVar("Out")


class MicroBatcher(Generic[In, Out]):
    """Batches calls of ``fn(list[In]) -> list[Out]``; one batch runs at a time."""

    def __init__(
        self,
        fn: Callable[[Sequence[In]], list[Out]],
        max_batch: int,
        max_wait_s: float,
        on_batch: Callable[[int, float], None] | None = None,
    ) -> None:
        self._fn = fn
        self.max_batch = max_batch
        self.max_wait_s = max_wait_s
        self._on_batch = on_batch
        self._queue: asyncio.Queue[tuple[In, asyncio.Future[Out]]] | None = None
        self._task: asyncio.Task[None] | None = None
        # One thread: batches run in order and a GPU sees one stream of work.
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sibylla-infer")

    async def warm_up(self, items: Sequence[In]) -> None:
        """Run the model once on ``items`` in its thread, outside the metrics: the first call
        of a model pays one-time costs (lazy initialisation, kernels for new shapes) that
        would otherwise land on the first real decision."""
        await asyncio.get_running_loop().run_in_executor(self._executor, self._fn, items)

    async def submit_many(self, items: Sequence[In]) -> list[Out]:
        """Results for ``items`` in order, batched with whatever else is waiting."""
        if self._queue is None:
            self._queue = asyncio.Queue()
            self._task = asyncio.get_running_loop().create_task(self._run(), name="batcher")
        loop = asyncio.get_running_loop()
        futures: list[asyncio.Future[Out]] = []
        for item in items:
            fut: asyncio.Future[Out] = loop.create_future()
            self._queue.put_nowait((item, fut))
            futures.append(fut)
        return list(await asyncio.gather(*futures))

    async def _run(self) -> None:
        assert self._queue is not None
        queue = self._queue
        loop = asyncio.get_running_loop()
        while True:
            batch = [await queue.get()]
            # One turn of the loop: windows submitted by other actors woken in the same tick
            # join this batch rather than wait for the next.
            await asyncio.sleep(0)
            deadline = loop.time() + self.max_wait_s
            while len(batch) < self.max_batch:
                if queue.empty():
                    remaining = deadline - loop.time()
                    if remaining <= 0:
                        break
                    try:
                        batch.append(await asyncio.wait_for(queue.get(), remaining))
                    except TimeoutError:
                        break
                else:
                    batch.append(queue.get_nowait())
            items = [item for item, _ in batch]
            started = time.perf_counter()
            try:
                results = await loop.run_in_executor(self._executor, self._fn, items)
                if len(results) != len(items):
                    raise RuntimeError(f"classifier returned {len(results)} for {len(items)}")
            except Exception as exc:  # noqa: BLE001 - handed to every waiter
                log.exception("classification of a batch of %d failed", len(items))
                for _, fut in batch:
                    if not fut.done():
                        fut.set_exception(exc)
                continue
            if self._on_batch is not None:
                self._on_batch(len(items), time.perf_counter() - started)
            for (_, fut), result in zip(batch, results, strict=True):
                if not fut.done():
                    fut.set_result(result)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        self._executor.shutdown(wait=False, cancel_futures=True)
