"""Deciding in process: a failure whose log has ended is decided with its termination; any
other waits in the pending table, and one task per partition decides what ingest and the
timer then find ready. Nothing leaves the pending table before it is decided."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import orjson
import pytest
from faust.types import TP

from sibylla.schemas.records import JobEvent
from sibylla.settings import Settings
from sibylla.streams.agents import CATCH_UP_LIMIT_S, LEDGER_CHECK_S, Pipeline
from sibylla.streams.bulk import Record, RecordEvent
from sibylla.streams.worker import build_worker

JOBS = ("job-a", "job-b", "job-c")


def _pending(job_id: str, ended_s_ago: float = 10.0) -> bytes:
    event = JobEvent(job_id, 0, "finished", "FAILED", 1)
    return orjson.dumps({"event": event.to_dict(), "event_time": time.time() - ended_s_ago,
                         "deadline": time.time() - ended_s_ago + 2, "log_end": None})


class _Model:
    """Stands for the decide path's classification: records the windows it is asked about,
    decides nothing (the attempts stay pending), and can be held or made to fail."""

    def __init__(self) -> None:
        self.asked: list[list[str]] = []
        self.hold = asyncio.Event()
        self.hold.set()
        self.fail_next = False

    async def classify(self, windows: list[Any]) -> None:
        self.asked.append([w.job_id for w in windows])
        await self.hold.wait()
        if self.fail_next:
            self.fail_next = False
            raise RuntimeError("the model process died")
        return None


@pytest.fixture
def worker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Pipeline, _Model]:
    """A worker owning partition 0 of a one-partition topology, with a failed termination of
    each job in JOBS pending past its grace period, and the decisions topic holding none."""
    settings = Settings.from_env({"SIBYLLA_PARTITIONS": "1"}, store="memory",
                                 data_dir=str(tmp_path))
    pipeline = build_worker(settings, SimpleNamespace(version="v0", predict=None))
    pipeline.t = dataclasses.replace(
        pipeline.t, decided={}, pending={f"0:{job}": _pending(job) for job in JOBS})
    pipeline._decisions_swept[0] = time.time()  # no sweep of old decisions in these calls
    model = _Model()

    async def on_topic(partition: int, asked: dict[str, float]) -> dict[str, bytes]:
        return {}

    monkeypatch.setattr(pipeline, "_classify", model.classify)
    monkeypatch.setattr(pipeline.ledger, "decided", on_topic)
    return pipeline, model


async def _idle(pipeline: Pipeline) -> None:
    while pipeline._deciders:
        await asyncio.sleep(0)


async def test_attempts_asked_during_a_batch_are_decided_next_by_the_same_task(
        worker: tuple[Pipeline, _Model]) -> None:
    """A burst of failures on a partition is decided in batches, none lost and none twice,
    and the task ends once the queue is empty; the next request starts another."""
    pipeline, model = worker
    model.hold.clear()
    pipeline._decide_soon(0, "0:job-a")
    await asyncio.sleep(0)  # the task takes job-a's batch and waits on the model
    pipeline._decide_soon(0, "0:job-b")
    pipeline._decide_soon(0, "0:job-c")
    pipeline._decide_soon(0, "0:job-b")  # asked twice (the timer and ingest): decided once
    model.hold.set()
    await _idle(pipeline)
    assert model.asked == [["job-a"], ["job-b", "job-c"]]
    pipeline._decide_soon(0, "0:job-a")
    await _idle(pipeline)
    assert model.asked[-1] == ["job-a"]


async def test_a_batch_that_fails_stays_pending_and_later_ones_are_decided(
        worker: tuple[Pipeline, _Model]) -> None:
    pipeline, model = worker
    model.hold.clear()
    model.fail_next = True
    pipeline._decide_soon(0, "0:job-a")
    await asyncio.sleep(0)
    pipeline._decide_soon(0, "0:job-b")
    model.hold.set()
    await _idle(pipeline)
    assert model.asked == [["job-a"], ["job-b"]]
    assert "0:job-a" in pipeline.t.pending, "the timer asks again (REQUEST_RETRY_S)"
    assert "0:job-a" in pipeline._requested


async def test_a_revoked_partitions_decisions_stop(worker: tuple[Pipeline, _Model]) -> None:
    """As faust stops a revoked partition's agents: its new owner decides what is pending."""
    pipeline, model = worker
    model.hold.clear()
    pipeline._decide_soon(0, "0:job-a")
    await asyncio.sleep(0)
    pipeline._decide_soon(0, "0:job-b")
    await pipeline._on_revoked(pipeline.t.app, {TP(pipeline.t.logs.get_topic_name(), 0)})
    model.hold.set()
    await asyncio.sleep(0.01)
    assert model.asked == [["job-a"]]
    assert not pipeline._deciders and 0 not in pipeline._to_decide
    assert set(pipeline.t.pending) == {f"0:{job}" for job in JOBS}


async def test_after_a_restart_the_timer_decides_once_ingest_took_the_log(
        worker: tuple[Pipeline, _Model], monkeypatch: pytest.MonkeyPatch) -> None:
    """A restarted worker finds the terminations pending in its table and the job's log
    records still being replayed: decided before ingest took them, an attempt was decided on
    an empty window (a fault campaign: six attempts of 41-250 lines decided with none)."""
    pipeline, model = worker
    pipeline.t.pending = {"0:job-a": _pending("job-a")}
    owned = {TP(pipeline.t.job_events.get_topic_name(), 0)}
    monkeypatch.setattr(pipeline.t.app.assignor, "assigned_actives", lambda: owned)
    pipeline._assigned_at[0] = time.time()  # just restarted: the catch-up wait starts now
    taken = False

    async def logs_taken(job_id: str, log_end: int | None) -> bool:
        return taken

    monkeypatch.setattr(pipeline, "_logs_taken", logs_taken)
    await pipeline._request_due_decisions()
    await _idle(pipeline)
    assert model.asked == []
    taken = True
    await pipeline._request_due_decisions()
    await _idle(pipeline)
    assert model.asked == [["job-a"]]


async def test_a_log_never_taken_is_decided_after_the_catch_up_limit(
        worker: tuple[Pipeline, _Model], monkeypatch: pytest.MonkeyPatch) -> None:
    pipeline, model = worker
    pipeline.t.pending = {"0:job-a": _pending("job-a", ended_s_ago=CATCH_UP_LIMIT_S + 5)}
    owned = {TP(pipeline.t.job_events.get_topic_name(), 0)}
    monkeypatch.setattr(pipeline.t.app.assignor, "assigned_actives", lambda: owned)

    async def logs_not_taken(job_id: str, log_end: int | None) -> bool:
        return False

    monkeypatch.setattr(pipeline, "_logs_taken", logs_not_taken)
    await pipeline._request_due_decisions()
    await _idle(pipeline)
    assert model.asked == [["job-a"]]


def _termination(pipeline: Pipeline, job_id: str, offset: int) -> RecordEvent:
    value = orjson.dumps(JobEvent(job_id, 0, "finished", "FAILED", 1, None, ("node-1",), 8,
                                  time.time()).to_dict())
    return RecordEvent(Record(pipeline.t.job_events.get_topic_name(), 0, offset,
                              job_id.encode(), value, time.time()))


async def _terminations(pipeline: Pipeline, events: list[RecordEvent],
                        monkeypatch: pytest.MonkeyPatch,
                        asked_log_end: list[tuple[str, int]] | None = None) -> None:
    """The terminations agent's batch, with no consumer behind it (no records skipped); the
    log partition's end is 0 (``asked_log_end`` collects the questions)."""

    async def as_read(events: list[RecordEvent]) -> list[RecordEvent]:
        return events

    async def finished(events: list[RecordEvent]) -> None:
        return None

    async def log_end(topic: str, partition: int) -> int:
        if asked_log_end is not None:
            asked_log_end.append((topic, partition))
        return 0

    monkeypatch.setattr(pipeline, "_with_missing", as_read)
    monkeypatch.setattr(pipeline, "_finished", finished)
    monkeypatch.setattr(pipeline.offsets, "end_offset", log_end)
    await pipeline._terminations_batch(events)


async def test_failures_whose_log_ended_are_decided_with_their_terminations(
        worker: tuple[Pipeline, _Model], monkeypatch: pytest.MonkeyPatch) -> None:
    """One batch for the model per batch of terminations; a failure whose log has not
    ended waits in the pending table for the rest of its log."""
    pipeline, model = worker
    pipeline.t.pending = {}
    for job_id in ("job-a", "job-b"):
        window = pipeline.cache.get_or_create(0, f"0:{job_id}")
        window.extend(["step 1 loss 0.5", "RuntimeError: shape mismatch"], time.time())
        window.eos = True
    pipeline.cache.get_or_create(0, "0:job-c").extend(["step 1 loss 0.5"], time.time())
    await _terminations(pipeline, [_termination(pipeline, job, i)
                                   for i, job in enumerate(JOBS)], monkeypatch)
    assert model.asked == [["job-a", "job-b"]]
    assert orjson.loads(pipeline.t.pending["0:job-c"])["deadline"] > time.time(), (
        "job-c waits out its grace period for the rest of its log")


async def test_failures_waiting_for_the_rest_of_their_log_ask_for_its_end_once_per_batch(
        worker: tuple[Pipeline, _Model], monkeypatch: pytest.MonkeyPatch) -> None:
    """Each waits until ingest has taken its log partition up to the end it had then: one
    question to the broker for the batch, not one per termination."""
    pipeline, model = worker
    pipeline.t.pending = {}
    asked: list[tuple[str, int]] = []
    await _terminations(pipeline, [_termination(pipeline, job, i) for i, job in enumerate(JOBS)],
                        monkeypatch, asked)
    assert asked == [(pipeline.t.logs.get_topic_name(), 0)]
    pending = [orjson.loads(pipeline.t.pending[f"0:{job}"]) for job in JOBS]
    assert [entry["log_end"] for entry in pending] == [0] * len(JOBS)
    assert model.asked == []


async def test_a_failure_the_model_could_not_decide_at_termination_is_left_pending(
        worker: tuple[Pipeline, _Model], monkeypatch: pytest.MonkeyPatch) -> None:
    """Its termination is acknowledged with the batch: without the pending entry, nothing
    would ever decide it. The timer asks again."""
    pipeline, model = worker
    pipeline.t.pending = {}
    pipeline.cache.get_or_create(0, "0:job-a").eos = True
    model.fail_next = True
    await _terminations(pipeline, [_termination(pipeline, "job-a", 0)], monkeypatch)
    assert model.asked == [["job-a"]]
    pending = orjson.loads(pipeline.t.pending["0:job-a"])
    assert pending["event"]["job_id"] == "job-a" and pending["deadline"] <= time.time()
    assert "0:job-a" in pipeline._requested


async def test_a_termination_read_again_while_its_failure_is_decided_is_not_decided_twice(
        worker: tuple[Pipeline, _Model], monkeypatch: pytest.MonkeyPatch) -> None:
    """A failure decided with its termination has no pending entry while the model works, and
    the batch waits for it (the model's first load, at start). The stall check took the
    partition for stalled then and read the termination again: taken as new, it was decided
    a second time."""
    pipeline, model = worker
    pipeline.t.pending = {}
    pipeline.cache.get_or_create(0, "0:job-a").eos = True
    termination = _termination(pipeline, "job-a", 0)
    topic = termination.message.topic
    model.hold.clear()
    agent_batch = pipeline._working(lambda events: _terminations(pipeline, events,
                                                                 monkeypatch))
    first = asyncio.ensure_future(agent_batch([termination]))
    while not model.asked:
        await asyncio.sleep(0)
    # The stall check, with the partition's last finished offset behind its end for longer
    # than STALL_S: read again, the termination would be handled beside the batch.
    monkeypatch.setattr(pipeline.t.app.assignor, "assigned_actives", lambda: {TP(topic, 0)})
    monkeypatch.setattr(pipeline.t.app, "_producer",
                        SimpleNamespace(buffer=SimpleNamespace(size=0, max_messages=100)))
    pipeline.gaps.table = {f"{topic}/0": b"-1"}
    pipeline.gaps._progress[(topic, 0)] = (-1, time.monotonic() - 60)

    async def read_again(topic: str, partition: int, start: int, end: int) -> list[Any]:
        return [termination]

    async def partition_ends(topic: str, partitions: list[int]) -> dict[int, int]:
        return dict.fromkeys(partitions, 1)

    monkeypatch.setattr(pipeline.gaps, "_fetch", read_again)
    monkeypatch.setattr(pipeline.offsets, "end_offsets", partition_ends)
    stall_check = asyncio.ensure_future(pipeline._catch_up_stalled())
    await asyncio.wait([stall_check], timeout=2.0)
    model.hold.set()
    await asyncio.gather(first, stall_check)
    assert model.asked == [["job-a"]]


@pytest.mark.parametrize(("replays_end", "owned_s", "checked"), [
    # job-a's termination (offset 3) lies below the end when the worker got the partition:
    # an earlier owner may have decided it. job-b's and job-c's (7, 8) came after.
    (5, 1.0, ["job-a"]),
    (5, LEDGER_CHECK_S + 1, ["job-a"]),  # a replay is one however late it comes
    (None, 1.0, ["job-a", "job-b", "job-c"]),  # end unknown: all, while the partition is new
    (None, LEDGER_CHECK_S + 1, []),
])
async def test_only_terminations_an_earlier_owner_may_have_taken_are_checked_on_the_topic(
        worker: tuple[Pipeline, _Model], monkeypatch: pytest.MonkeyPatch,
        replays_end: int | None, owned_s: float, checked: list[str]) -> None:
    """The decisions topic is read back (a broker round trip per decide batch, queued behind
    the other partitions' reads) only for a termination that may be a replay: the decided
    table restored after a hand-over can lack an earlier owner's decision (ledger.py). A
    failure left pending keeps its termination's offset for that question."""
    pipeline, model = worker
    pipeline.t.pending = {}
    asked: list[str] = []

    async def on_topic(partition: int, terminated_at: dict[str, float]) -> dict[str, bytes]:
        asked.extend(sorted(terminated_at))
        return {}

    async def ends_then(topic: str, partitions: list[int]) -> dict[int, int] | None:
        return None if replays_end is None else dict.fromkeys(partitions, replays_end)

    monkeypatch.setattr(pipeline.ledger, "decided", on_topic)
    monkeypatch.setattr(pipeline.offsets, "end_offsets", ends_then)
    pipeline._assigned_at[0] = time.time() - owned_s
    await pipeline._note_replays_end([0], pipeline._assigned_at[0])
    for job_id in ("job-a", "job-b", "job-c"):
        window = pipeline.cache.get_or_create(0, f"0:{job_id}")
        window.extend(["step 1 loss 0.5", "RuntimeError: shape mismatch"], time.time())
        window.eos = job_id != "job-c"  # job-c's log has not ended: it waits, pending
    await _terminations(pipeline, [_termination(pipeline, "job-a", 3),
                                   _termination(pipeline, "job-b", 7),
                                   _termination(pipeline, "job-c", 8)], monkeypatch)
    pipeline._decide_soon(0, "0:job-c")  # its log ended: ingest asks for the decision
    await _idle(pipeline)
    assert model.asked == [["job-a", "job-b"], ["job-c"]]
    assert [key.removeprefix("0:") for key in asked] == checked


@pytest.mark.parametrize(("history", "decided", "expected"), [
    ([0, 1], [0, 1], 1),  # the usual: the history's last attempt is decided
    ([0, 1, 2], [0, 1], 1),  # attempt 2's decision is not out yet
    ([0], [0, 1, 2], 2),  # attempts 1 and 2 were adopted from the decisions topic
    ([], [0], 0),
    ([], [], None),
])
def test_the_latest_decision_of_a_job(worker: tuple[Pipeline, _Model], history: list[int],
                                      decided: list[int], expected: int | None) -> None:
    """What ``GET /decisions/{job_id}`` answers: the decision of the job's highest decided
    attempt."""
    pipeline, _ = worker
    facts = [SimpleNamespace(attempt=n) for n in history]  # what the history keeps, in order
    pipeline.memory.history = lambda job_id: facts  # type: ignore[method-assign,assignment]
    pipeline.t.decided = {f"{n}:job-a": f"decision {n}".encode() for n in decided}
    found = pipeline.latest_decision("job-a")
    assert found == (None if expected is None else f"decision {expected}".encode())
