"""The loop end to end on a real broker: failed attempts and their retries' outcomes flow in,
labels come out, the trainer fine-tunes and promotes a model, the worker's next decision
carries the promoted model's version, and an operator's label through the HTTP API overrules
a retry outcome.

Needs ``sibylla.online_learning.worker.register`` wired into the worker (streams/worker.py).
The trainer process's loop runs in the test's event loop with a gate that lets anything
through: what is tested here is the plumbing (labels, fine-tune, announcement, checksum, hot
swap); the gate has its own tests. The trainer signs with a key pair of the test's own and the
worker checks it; operator labels need a bearer token.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import orjson
import pytest

from sibylla.online_learning.service import run_trainer
from sibylla.online_learning.settings import OnlineSettings
from sibylla.online_learning.signing import generate_key_pair
from sibylla.online_learning.store import ModelStore
from sibylla.schemas.records import Decision, JobEvent, Label
from sibylla.settings import Settings
from sibylla.streams.ship import Shipper
from tests.integration.fixtures import (
    DETERMINISTIC_LOG,
    NONDETERMINISTIC_LOG,
    collect_decisions,
    make_settings,
    read_all,
    start_worker,
)

pytestmark = pytest.mark.integration


async def _attempt(shipper: Shipper, job_id: str, attempt: int, log: str | None,
                   state: str) -> None:
    if log is not None:
        await shipper.send_lines(job_id, log.splitlines(), attempt=attempt, eos=True)
    await shipper.send_event(JobEvent(job_id, attempt, "finished", state,
                                      0 if state == "COMPLETED" else 1, None, ("gpu-a01",), 8))


async def _labels(settings: Settings) -> list[Label]:
    return [Label.from_json(orjson.dumps(r)) for r in await read_all(settings, "labels", 1.0)]


def test_outcomes_become_labels_and_a_promoted_model_makes_the_next_decision(
        broker, unique_prefix: str, tmp_path: Path) -> None:
    settings = make_settings(broker.bootstrap_servers, unique_prefix, tmp_path)
    _, public_key = generate_key_pair(tmp_path / "trainer.key")
    tokens = tmp_path / "operators"
    tokens.write_text("alice:alice-token-0123456789\n")
    tokens.chmod(0o600)
    online = OnlineSettings(models_dir=tmp_path / "models", finetune_every=2,
                            holdout_every=1_000_000, finetune_epochs=1, gate_tolerance=1.0,
                            gate_precision_tolerance=1.0, trainer_metrics_port=0,
                            model_signing_key=str(tmp_path / "trainer.key"),
                            model_public_key=public_key, operator_tokens_file=str(tokens))
    with start_worker(settings, tmp_path, extra_env=online.to_env()) as worker:

        async def failures_and_retries() -> list[Label]:
            async with Shipper(settings) as shipper:
                # Same error twice: attempt 0 was deterministic whatever the model said.
                await _attempt(shipper, "job-shape", 0, DETERMINISTIC_LOG, "FAILED")
                await _attempt(shipper, "job-nccl", 0, NONDETERMINISTIC_LOG, "FAILED")
                await shipper.flush()
                await collect_decisions(settings, {"job-shape", "job-nccl"}, timeout_s=90)
                await _attempt(shipper, "job-shape", 1, DETERMINISTIC_LOG, "FAILED")
                await _attempt(shipper, "job-nccl", 1, "epoch 9 done", "COMPLETED")
                await shipper.flush()
            wanted = {("job-shape", 0), ("job-nccl", 0)}
            deadline = time.monotonic() + 150
            while True:
                labels = await _labels(settings)
                done = {(lab.job_id, lab.attempt) for lab in labels} >= wanted
                if done or time.monotonic() > deadline:
                    return labels

        labels = asyncio.run(failures_and_retries())
        got = {(lab.job_id, lab.attempt): lab.label for lab in labels}
        assert got.get(("job-shape", 0)) == "deterministic", worker.tail()
        assert got.get(("job-nccl", 0)) == "nondeterministic", worker.tail()

        async def train_until_swapped() -> str:
            """The trainer process's loop, until the worker runs what it promoted."""
            task = asyncio.create_task(run_trainer(settings, online))
            try:
                deadline = time.monotonic() + 180
                while time.monotonic() < deadline and not task.done():
                    current = ModelStore(online.models_dir).current
                    if current is not None and current.status == "promoted" and (
                            f'sibylla_model_info{{device="cpu",version="{current.version}"}} 1.0'
                            in worker.metrics_text()):
                        return current.version
                    await asyncio.sleep(0.5)
                return ""
            finally:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

        version = asyncio.run(train_until_swapped())
        assert version, worker.tail()
        [entry] = [e for e in ModelStore(online.models_dir).entries() if e.status == "promoted"]
        assert entry.scores["n_new"] == 2 and entry.sha256

        async def next_decision() -> list[Decision]:
            async with Shipper(settings) as shipper:
                await _attempt(shipper, "job-after", 0, DETERMINISTIC_LOG, "FAILED")
                await shipper.flush()
            return await collect_decisions(settings, {"job-after"}, timeout_s=60)

        after = [d for d in asyncio.run(next_decision()) if d.job_id == "job-after"]
        assert [d.model_version for d in after] == [version], worker.tail()

        # Without the operator's token, no label: 401 without one, 403 with a wrong one.
        url = f"http://127.0.0.1:{worker.settings.web_port}/labels/job-nccl/0"
        for auth, status in ((None, 401), ("Bearer not-alice-token-0123", 403)):
            headers = {"Content-Type": "application/json", **(
                {"Authorization": auth} if auth else {})}
            request = urllib.request.Request(url, data=b'{"label": "deterministic"}',
                                             method="POST", headers=headers)
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(request, timeout=10)
            assert refused.value.code == status
            assert "token" in orjson.loads(refused.value.read())["error"]
        metrics = worker.metrics_text()
        assert 'sibylla_operator_requests_refused_total{reason="missing_token"} 1.0' in metrics
        assert 'sibylla_operator_requests_refused_total{reason="wrong_token"} 1.0' in metrics

        # An operator overrules the retry outcome with `sibylla label` and her token.
        env = {**os.environ, "SIBYLLA_OPERATOR_TOKEN": "alice-token-0123456789"}
        done = subprocess.run(
            [sys.executable, "-m", "sibylla", "label", "job-nccl", "0", "deterministic",
             "--url", f"http://127.0.0.1:{worker.settings.web_port}"],
            capture_output=True, text=True, timeout=60, env=env)
        assert done.returncode == 0, done.stderr
        assert "as alice" in done.stdout

        async def relabeled() -> list[Label]:
            deadline = time.monotonic() + 60
            while True:
                found = [lab for lab in await _labels(settings)
                         if (lab.job_id, lab.attempt, lab.label) == ("job-nccl", 0,
                                                                     "deterministic")]
                if found or time.monotonic() > deadline:
                    return found

        [label] = asyncio.run(relabeled())
        assert {v.source for v in label.votes} >= {"operator", "outcome"}
        assert [v.by for v in label.votes if v.source == "operator"] == ["alice"]


def test_a_starting_worker_acts_on_the_last_announcement_per_model_only(
        broker, unique_prefix: str, tmp_path: Path) -> None:
    """Older announcements still on the (not yet compacted) models topic are history: a
    restarted worker must not load each in turn, nor count them as replays of its newest."""
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

    from sibylla.online_learning.worker import _latest_per_key
    from sibylla.streams.topics import ensure_topics

    settings = make_settings(broker.bootstrap_servers, unique_prefix, tmp_path)

    async def backlog() -> list[bytes]:
        await ensure_topics(settings)
        topic = settings.topic("models")
        producer = AIOKafkaProducer(bootstrap_servers=settings.bootstrap_servers)
        await producer.start()
        for key, value in ((b"a", b"a1"), (b"a", b"a2"), (b"b", b"b1"), (b"a", b"a3")):
            await producer.send_and_wait(topic, value, key=key)
        await producer.stop()
        consumer = AIOKafkaConsumer(bootstrap_servers=settings.bootstrap_servers,
                                    group_id=None, enable_auto_commit=False)
        await consumer.start()
        try:
            tps = [TopicPartition(topic, 0)]
            consumer.assign(tps)
            await consumer.seek_to_beginning(*tps)
            return await _latest_per_key(consumer, tps)
        finally:
            await consumer.stop()

    assert asyncio.run(backlog()) == [b"b1", b"a3"]
