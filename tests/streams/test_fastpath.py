"""The consumer's fast path: the hand-stepped callback behaves like an awaited coroutine, and a
bulk topic's fetch is delivered and acknowledged as faust's per-record loop would."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiokafka.structs import ConsumerRecord
from faust.transport.drivers import aiokafka as aiokafka_driver
from faust.types import TP

from sibylla.streams.fastpath import SibyllaApp, _is_wait_of, _resume

LOGS, VOTES = TP("sibylla.logs", 0), TP("sibylla.label-votes", 0)


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


# ------------------------------------------------------------------ bulk delivery

def _records(topic: str, *offsets: int) -> list[ConsumerRecord[bytes, bytes]]:
    return [ConsumerRecord(topic, 0, o, 1_000, 0, b"job", b"{}", None, 3, 2, []) for o in offsets]


@pytest.fixture
def consumer(monkeypatch: pytest.MonkeyPatch) -> Any:
    """The consumer of a worker's app, not started: what it does with what a fetch returned."""
    app = SibyllaApp("fastpath-test", broker="kafka://127.0.0.1:1")
    app.bulk_topics.add(LOGS.topic)
    app.topics._acking_topics.update({LOGS.topic, VOTES.topic})
    consumer = app.consumer
    delivered: list[Any] = []

    async def conductor(message: Any) -> None:
        message.incref()
        delivered.append(message)

    consumer.callback = conductor
    consumer.delivered = delivered
    monkeypatch.setattr(consumer, "highwater", lambda tp: 100)
    return consumer


def _fetch_returns(monkeypatch: pytest.MonkeyPatch, records: dict[TP, list[Any]]) -> None:
    async def fetched(self: Any, timeout: float) -> tuple[Any, Any]:
        return records, None
    monkeypatch.setattr(aiokafka_driver.Consumer, "_wait_next_records", fetched)


async def test_a_bulk_topics_fetch_reaches_the_conductor_as_one_message_the_rest_per_record(
        consumer: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    _fetch_returns(monkeypatch, {LOGS: _records(LOGS.topic, 0, 1, 2),
                                 VOTES: _records(VOTES.topic, 0, 1)})
    rest, _ = await consumer._wait_next_records(1.0)
    assert list(rest) == [VOTES]  # faust's own loop hands these on one at a time
    (message,) = consumer.delivered
    assert [e.message.offset for e in message.events] == [0, 1, 2]
    assert consumer._read_offset[LOGS] == 2


async def test_records_below_the_read_offset_are_not_delivered_again(
        consumer: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    consumer._read_offset[LOGS] = 5  # e.g. after a seek back
    _fetch_returns(monkeypatch, {LOGS: _records(LOGS.topic, 3, 4, 5, 6)})
    await consumer._wait_next_records(1.0)
    (message,) = consumer.delivered
    assert [e.message.offset for e in message.events] == [5, 6]


async def test_nothing_is_delivered_once_a_rebalance_began(
        consumer: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    consumer.flow_active = False  # faust stops the flow as a rebalance begins
    _fetch_returns(monkeypatch, {LOGS: _records(LOGS.topic, 0), VOTES: _records(VOTES.topic, 0)})
    rest, _ = await consumer._wait_next_records(1.0)
    assert rest == {} and consumer.delivered == []  # read again from the committed offsets


async def test_acknowledging_a_fetch_lets_the_commit_pass_all_its_offsets_and_holes_before_it(
        consumer: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    consumer._read_offset[LOGS] = 9
    consumer._committed_offset[LOGS] = 10
    # 10 and 11 hold no record (a transaction marker, compacted records), 13 neither
    _fetch_returns(monkeypatch, {LOGS: _records(LOGS.topic, 12, 14)})
    await consumer._wait_next_records(1.0)
    (message,) = consumer.delivered
    assert consumer._new_offset(LOGS) is None  # nothing acknowledged yet
    assert message.ack(consumer)
    assert not message.ack(consumer)  # once
    assert consumer._new_offset(LOGS) == 15


async def test_the_commit_hooks_run_before_the_offsets_are_committed(
        consumer: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    happened: list[str] = []

    async def save_windows() -> None:
        happened.append("hook")

    async def commit(self: Any, offsets: Any, start_new_transaction: bool = True) -> bool:
        happened.append(f"commit {dict(offsets)}")
        return True

    monkeypatch.setattr(aiokafka_driver.Consumer, "_commit_offsets", commit)
    consumer.app.commit_hooks.append(save_windows)
    assert await consumer._commit_offsets({LOGS: 7})
    assert happened == ["hook", f"commit {({LOGS: 7})}"]
