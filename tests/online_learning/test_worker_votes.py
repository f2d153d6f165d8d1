"""The votes agent without a broker: decisions and retry outcomes in, labels out; operator
labels win; announced models are swapped in only when their checksum matches (their
signatures: test_security.py)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import orjson
import pytest
from prometheus_client import CollectorRegistry

from sibylla.inference.api import LogWindow
from sibylla.inference.checkpoint import save_checkpoint
from sibylla.online_learning.announce import (
    AnnouncementError,
    announcement,
    sha256_file,
    verify,
)
from sibylla.online_learning.settings import OnlineSettings
from sibylla.online_learning.store import ModelEntry, ModelStore
from sibylla.online_learning.worker import OnlineLearning
from sibylla.schemas.records import Decision, Label
from sibylla.settings import Settings
from sibylla.streams.keys import partition_of
from sibylla.streams.reading import WindowReading, read_window
from tests.online_learning.fixtures import examples, tiny_checkpoint

ERROR = ["Traceback (most recent call last):", '  File "/home/u/train.py", line 3',
         "RuntimeError: mat1 and mat2 shapes cannot be multiplied (64x512 and 1024x10)"]


class FakeTopic:
    def __init__(self) -> None:
        self.sent: list[tuple[bytes, bytes]] = []

    async def send(self, key: bytes, value: bytes, force: bool = False) -> None:
        self.sent.append((key, value))


class FakeApp:
    def Table(self, name: str, **_: Any) -> dict[str, bytes]:  # noqa: N802 - faust's name
        return {}

    def topic(self, name: str, **_: Any) -> FakeTopic:
        return FakeTopic()


def fake_pipeline(data_dir: Path = Path("sibylla-data")) -> Any:
    labels = FakeTopic()
    p = SimpleNamespace(
        settings=Settings.from_env({}, data_dir=data_dir),
        t=SimpleNamespace(app=FakeApp(), labels=labels),
        metrics=SimpleNamespace(registry=CollectorRegistry()), decided_hooks=[],
        swapped=[])
    p.in_event = lambda event: None

    async def model() -> Any:
        return SimpleNamespace(version="v0")
    p.model = model
    p.swap_classifier = lambda classifier, scores=None: p.swapped.append(classifier)
    return p


def loop(online: OnlineSettings | None = None, data_dir: Path = Path("sibylla-data")
         ) -> tuple[OnlineLearning, FakeTopic]:
    """The loop on a fake pipeline; ``data_dir`` is only written when a model is accepted."""
    p = fake_pipeline(data_dir)
    return OnlineLearning(p, online or OnlineSettings(), {}), p.t.labels


def decision(attempt: int, verdict: str = "unknown", confidence: float = 0.55) -> Decision:
    return Decision("job", attempt, verdict, confidence, "python_runtime_error",  # type: ignore[arg-type]
                    "default_policy", [], [], "v0", 0.0, 1.0)


def read(window: LogWindow, decided: Decision) -> tuple[LogWindow, Decision, WindowReading]:
    """A decided window as the decide agent hands it to its hooks: with its reading."""
    return window, decided, read_window(window)


def labels(topic: FakeTopic) -> list[Label]:
    return [Label.from_json(v) for _, v in topic.sent]


def batch(*values: bytes) -> list[Any]:
    """Records of partition 0 as an agent's batch holds them."""
    return [SimpleNamespace(message=SimpleNamespace(value=value, partition=0))
            for value in values]


async def events(*values: bytes) -> AsyncIterator[Any]:
    for event in batch(*values):
        yield event


class Stream:
    def __init__(self, *values: bytes) -> None:
        self.values = values

    def events(self) -> AsyncIterator[Any]:
        return events(*self.values)


async def test_a_retry_failing_the_same_way_labels_the_attempt_deterministic() -> None:
    ol, topic = loop()
    await ol.on_decided([read(LogWindow("job", 0, ["step 1", *ERROR], ERROR), decision(0))])
    assert labels(topic) == []  # an unsure model alone is thin evidence
    window = LogWindow("job", 1, ["[rank2]: " + e for e in ERROR], ["[rank2]: " + e for e in ERROR])
    await ol.on_decided([read(window, decision(1))])
    [label] = labels(topic)
    assert (label.job_id, label.attempt, label.label) == ("job", 0, "deterministic")
    assert [v.source for v in label.votes] == ["outcome"]
    assert "RuntimeError: mat1" in label.log


async def test_a_completed_retry_labels_nondeterministic_against_a_confident_model() -> None:
    ol, topic = loop()
    await ol.on_decided([read(LogWindow("job", 0, ERROR, ERROR),
                              decision(0, "deterministic", 1.0))])
    done = orjson.dumps({"job_id": "job", "attempt": 1, "event": "finished",
                         "state": "COMPLETED"})
    await ol._outcomes_batch(batch(b"not json", done))
    [label] = labels(topic)
    assert label.label == "nondeterministic"
    assert {v.source for v in label.votes} == {"outcome", "model:primary"}


async def test_an_operator_label_overrides_and_republishes() -> None:
    ol, topic = loop()
    await ol.on_decided([read(LogWindow("job", 0, ERROR, ERROR), decision(0))])
    await ol.on_decided([read(LogWindow("job", 1, ERROR, ERROR), decision(1))])
    vote = orjson.dumps({"job_id": "job", "attempt": 0, "label": "nondeterministic",
                         "operator": "alice"})
    await ol._operator_votes(Stream(vote, b'{"job_id": "job", "attempt": 0, "label": "maybe"}'))
    assert [lab.label for lab in labels(topic)] == ["deterministic", "nondeterministic"]
    assert [v.by for v in labels(topic)[-1].votes if v.source == "operator"] == ["alice"]


async def test_an_operator_label_before_the_decision_waits_for_the_window() -> None:
    ol, topic = loop()
    vote = orjson.dumps({"job_id": "job", "attempt": 0, "label": "deterministic"})
    await ol._operator_votes(Stream(vote))
    assert labels(topic) == []
    await ol.on_decided([read(LogWindow("job", 0, ERROR, ERROR), decision(0))])
    [label] = labels(topic)
    assert label.label == "deterministic" and label.log


async def test_announced_model_is_swapped_only_with_the_right_checksum(tmp_path: Path) -> None:
    online = OnlineSettings(models_dir=tmp_path / "models", allow_unsigned_models=True)
    ol, _ = loop(online, tmp_path / "worker")
    cp = tiny_checkpoint(examples(16), version="v1")
    path = save_checkpoint(cp.model, cp.vocab, cp.meta, online.models_dir / "v1.safetensors")
    ann = announcement("sibylla-classifier", "v1", path, sha256_file(path), {}, 1, None)
    tampered = orjson.loads(ann.to_json()) | {"sha256": "0" * 64}
    assert not await ol.on_announcement(orjson.dumps(tampered))
    # Announced but refused: what the SibyllaModelAnnouncedNotLoaded alert compares.
    registry = ol.p.metrics.registry
    assert registry.get_sample_value("sibylla_model_announced_info", {"version": "v1"}) == 1
    assert not await ol.on_announcement(b"{}")
    assert await ol.on_announcement(ann.to_json())
    assert [c.version for c in ol.p.swapped] == ["v1"]


async def test_votes_older_than_the_ttl_are_dropped() -> None:
    ol, _ = loop()
    await ol.on_decided([read(LogWindow("job", 0, ERROR, ERROR), decision(0))])
    key = next(iter(ol.votes))
    partition = partition_of("job", ol.p.settings.partitions)
    assert ol.expire(partition, time.time()) == 0
    assert ol.expire(partition, time.time() + ol.s.votes_ttl_s + 1) == 1
    assert key not in ol.votes


def test_a_model_file_damaged_after_promotion_is_refused_by_the_workers(tmp_path: Path) -> None:
    """The announcement carries the checksum recorded when the model was stored, so a file
    changed on the shared volume since is refused rather than announced as it now is."""
    store = ModelStore(tmp_path)
    entry = store.record(ModelEntry("v1", "promoted"), tiny_checkpoint(examples(16)))
    path = store.path(entry)
    path.write_bytes(path.read_bytes()[:-8] + b"damaged!")
    with pytest.raises(AnnouncementError, match="does not match"):
        verify(announcement("sibylla-classifier", "v1", path, entry.sha256, {}, 1, None),
               [tmp_path.resolve()])
