"""Whenever the ingest agent yields to the event loop, a commit may save its windows: each must
then hold the lines of every record up to the offset it carries, or a restart that replays
those records would skip them as already in (a fault campaign found it, docs/pipeline-bench.md
finding 25)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import orjson
import pytest

from sibylla.settings import Settings
from sibylla.streams.keys import attempt_key
from sibylla.streams.worker import build_worker


def _event(offset: int, key: bytes, value: bytes) -> SimpleNamespace:
    return SimpleNamespace(message=SimpleNamespace(
        topic="sibylla.logs", partition=0, offset=offset, key=key, value=value))


def _pipeline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A worker's pipeline on the memory store whose ingest batches are taken as they are
    (no gap refetch) and finish at once (no broker to wait for)."""
    settings = Settings.from_env({}, store="memory", data_dir=str(tmp_path))
    pipeline: Any = build_worker(settings, SimpleNamespace(version="v0", predict=list))

    async def as_they_are(events: Any) -> Any:
        return events

    async def nothing(events: Any) -> None:
        return None

    monkeypatch.setattr(pipeline, "_with_missing", as_they_are)
    monkeypatch.setattr(pipeline, "_finished", nothing)
    return pipeline


async def test_a_window_holds_every_line_up_to_its_offset_whenever_ingest_awaits(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pipeline = _pipeline(tmp_path, monkeypatch)
    key = attempt_key("job-a", 0)
    at_await: list[tuple[int, list[str]]] = []

    async def reject(event: Any, exc: Exception, agent: str) -> None:
        # where a commit could run and save the window
        window = pipeline.cache.get_or_create(0, key)
        at_await.append((window.last_offset, window.tail))

    monkeypatch.setattr(pipeline, "_reject", reject)
    batch = orjson.dumps({"job_id": "job-a", "lines": [{"line": "epoch 1"}, {"line": "epoch 2"}]})
    line = orjson.dumps({"job_id": "job-a", "line": "epoch 3"})
    await pipeline._ingest_batch([
        _event(10, b"job-a", batch), _event(11, b"job-a", b"{not json"),
        _event(12, b"job-a", line), _event(13, b"job-a", b"[]"),
    ])
    assert at_await == [(10, ["epoch 1", "epoch 2"]), (12, ["epoch 1", "epoch 2", "epoch 3"])]
    window = pipeline.cache.get_or_create(0, key)
    assert (window.last_offset, window.tail) == (12, ["epoch 1", "epoch 2", "epoch 3"])


async def test_a_record_delivered_twice_in_one_batch_reaches_its_window_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # faust's fetch loop may go back within a batch after a seek (gaps.with_missing keeps
    # such replays): the second copy of a record must count as already in, as it did when
    # each record moved the window's offset at once.
    pipeline = _pipeline(tmp_path, monkeypatch)
    first = orjson.dumps({"job_id": "job-a", "line": "epoch 1"})
    second = orjson.dumps({"job_id": "job-a", "line": "epoch 2"})
    await pipeline._ingest_batch([
        _event(20, b"job-a", first), _event(21, b"job-a", second),
        _event(20, b"job-a", first), _event(21, b"job-a", second),
    ])
    window = pipeline.cache.get_or_create(0, attempt_key("job-a", 0))
    assert (window.last_offset, window.tail) == (21, ["epoch 1", "epoch 2"])
