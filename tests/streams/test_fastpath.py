"""The hand-stepped callback in the consumer's fast path behaves like an awaited coroutine."""

from __future__ import annotations

import asyncio

import pytest

from sibylla.streams.fastpath import _is_wait_of, _resume


async def test_a_callback_that_suspends_finishes_with_its_own_result() -> None:
    queue: asyncio.Queue[int] = asyncio.Queue(maxsize=1)
    queue.put_nowait(0)  # full: the callback's put must wait for a consumer

    async def callback() -> str:
        await queue.put(1)
        await asyncio.sleep(0)
        return "delivered"

    coro = callback()
    yielded = coro.send(None)  # runs until the put blocks
    resumed = asyncio.ensure_future(_resume(coro, yielded))
    await asyncio.sleep(0.01)
    assert not resumed.done()
    assert queue.get_nowait() == 0  # room again: the put completes
    assert await resumed == "delivered"
    assert queue.get_nowait() == 1


async def test_an_exception_inside_the_callback_reaches_the_caller() -> None:
    fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    async def callback() -> None:
        await fut

    coro = callback()
    yielded = coro.send(None)
    fut.set_exception(RuntimeError("broker gone"))
    with pytest.raises(RuntimeError, match="broker gone"):
        await _resume(coro, yielded)


def test_only_the_wait_of_the_given_event_is_recognised() -> None:
    flow, other = asyncio.Event(), asyncio.Event()
    waiting = flow.wait()
    try:
        assert _is_wait_of(waiting, flow)
        assert not _is_wait_of(waiting, other)
    finally:
        waiting.close()
