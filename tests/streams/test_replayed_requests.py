"""A decide request replayed after a restart or a hand-over waits for its window."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import orjson
import pytest

from sibylla.schemas.records import JobEvent
from sibylla.settings import Settings
from sibylla.streams.agents import Pipeline
from sibylla.streams.worker import build_worker

KEY = "0:job-a"  # attempt 0 of job-a


class _Event:
    """A decide request as the decide agent gets it (weakly referenced, as faust's are)."""

    def __init__(self, job_id: str = "job-a") -> None:
        self.message = SimpleNamespace(topic="decide-requests", partition=0, offset=7, key=b"",
                                       value=orjson.dumps({"job_id": job_id, "attempt": 0}))


def _pipeline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
              ) -> tuple[Pipeline, list[list[Any]]]:
    """A worker whose termination of job-a is pending past its grace period, with ingest not
    yet through the job's log; the model records the windows it is asked about."""
    settings = Settings.from_env({}, store="memory", data_dir=str(tmp_path))
    pipeline = build_worker(settings, SimpleNamespace(version="v0", predict=None))
    event = JobEvent("job-a", 0, "finished", "FAILED", 1)
    pending = {"event": event.to_dict(), "event_time": time.time() - 10,
               "deadline": time.time() - 8, "log_end": None}
    pipeline.t = dataclasses.replace(pipeline.t, decided={},
                                     pending={KEY: orjson.dumps(pending)})
    pipeline._decisions_swept[0] = time.time()  # no sweep of old decisions in this call
    asked: list[list[Any]] = []

    async def classify(windows: list[Any]) -> None:
        asked.append(windows)  # and decide nothing: the request stays pending
        return None

    async def logs_not_taken(job_id: str, log_end: int | None) -> bool:
        return False

    async def on_topic(partition: int, asked: dict[str, float]) -> dict[str, bytes]:
        return {}  # the decisions topic holds none of them

    monkeypatch.setattr(pipeline, "_classify", classify)
    monkeypatch.setattr(pipeline, "_logs_taken", logs_not_taken)
    monkeypatch.setattr(pipeline.ledger, "decided", on_topic)
    return pipeline, asked


async def test_a_replayed_request_is_not_decided_on_a_window_still_rebuilding(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """After a rebalance the request and the job's log records are both read again, from
    different topics. Taken first, the request was decided on an empty window (a fault
    campaign: six attempts of 41-250 lines decided with none, by the default policy)."""
    pipeline, asked = _pipeline(tmp_path, monkeypatch)
    await pipeline._decide_requested([_Event()])
    assert asked == []
    assert KEY in pipeline.t.pending, "still pending: the timer asks again once it is ready"


async def test_a_replayed_request_whose_log_has_ended_is_decided_at_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pipeline, asked = _pipeline(tmp_path, monkeypatch)
    window = pipeline.cache.get_or_create(0, KEY)
    window.extend(["step 1 loss 0.5", "RuntimeError: shape mismatch"], time.time())
    window.eos = True
    await pipeline._decide_requested([_Event()])
    assert [len(w.tail) for w in asked[0]] == [2]


async def test_a_request_this_worker_made_is_decided_as_it_stands(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """This worker asked once the log was taken (or waited long enough): no second check."""
    pipeline, asked = _pipeline(tmp_path, monkeypatch)
    pipeline.cache.get_or_create(0, KEY).extend(["step 1 loss 0.5"], time.time())
    pipeline._requested[KEY] = time.monotonic()
    await pipeline._decide_requested([_Event()])
    assert [len(w.tail) for w in asked[0]] == [1]


async def test_a_replay_of_many_requests_asks_the_broker_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Whether ingest has taken the logs is one question per partition: a restart that
    replays a backlog of requests must not ask the broker for offsets once per request."""
    pipeline, asked = _pipeline(tmp_path, monkeypatch)
    pending = pipeline.t.pending[KEY]
    jobs = [f"job-{i}" for i in range(5)]
    for job_id in jobs:
        pipeline.t.pending[f"0:{job_id}"] = pending
    questions: list[str] = []

    async def logs_not_taken(job_id: str, log_end: int | None) -> bool:
        questions.append(job_id)
        return False

    monkeypatch.setattr(pipeline, "_logs_taken", logs_not_taken)
    await pipeline._decide_requested([_Event(job_id) for job_id in jobs])
    assert asked == [] and len(questions) == 1
