"""``GET /ready`` and ``sibylla_worker_ready`` against a real broker's consumer group, and a
worker whose model cannot be loaded (it loads while the worker joins the group).

Two workers share a topic of one partition: whichever the group gives the partition to becomes
ready, the other says it has no partition (it is not ready, and says why); when the ready one
leaves, the other takes the partition over and becomes ready. The time from a worker's start to
its first ready answer is reported, not asserted.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from sibylla.streams.launch import WorkerProcess
from sibylla.streams.topics import ensure_topics
from tests.integration.fixtures import make_settings, metric, start_worker

pytestmark = pytest.mark.integration


def ready(worker: WorkerProcess) -> tuple[int, dict[str, Any]]:
    """(status, body) of the worker's /ready."""
    url = f"http://127.0.0.1:{worker.settings.web_port}/ready"
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def wait_until(check: Any, timeout_s: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.1)
    return False


def test_only_a_worker_owning_partitions_is_ready_and_a_spare_takes_over(
        broker: Any, unique_prefix: str, tmp_path: Path,
        record_property: Any) -> None:
    settings = make_settings(broker.bootstrap_servers, unique_prefix, tmp_path, partitions=1)
    started = time.monotonic()
    first = start_worker(settings, tmp_path, "first")
    second: WorkerProcess | None = None
    try:
        answers = [ready(first)]
        assert wait_until(lambda: answers.append(ready(first)) or answers[-1][0] == 200), (
            answers[-3:], first.tail())
        status, body = answers[-1]
        seen = time.monotonic() - started
        record_property("start_to_ready_s", round(seen, 2))
        print(f"\n[{broker.name}] start to first 200 on /ready: {seen:.1f} s (process start "
              f"included; the worker's own count from app start: {body['ready_after_s']} s); "
              f"answers before it: {[(s, b['reason']) for s, b in answers[:-1]][:3]}")
        assert body["ready"] is True and body["partitions"] == [0]
        assert all(s == 503 and not b["ready"] for s, b in answers[:-1])
        assert metric(first.metrics_text(), "sibylla_worker_ready") == 1

        second = start_worker(settings, tmp_path, "second")
        workers = [first, second]

        def settled() -> bool:
            states = [ready(w) for w in workers]
            return sorted(s for s, _ in states) == [200, 503] and any(
                "no partitions" in b["reason"] for _, b in states)

        assert wait_until(settled), ([ready(w) for w in workers], second.tail())
        owner = next(w for w in workers if ready(w)[0] == 200)
        spare = second if owner is first else first
        status, body = ready(spare)
        assert (status, body["ready"], body["partitions"]) == (503, False, [])
        assert "no partitions assigned" in body["reason"]
        assert metric(spare.metrics_text(), "sibylla_worker_ready") == 0

        owner.stop()  # a graceful leave: the group hands the partition to the spare
        assert wait_until(lambda: ready(spare)[0] == 200), (ready(spare), spare.tail())
        assert ready(spare)[1]["partitions"] == [0]
        assert metric(spare.metrics_text(), "sibylla_worker_ready") == 1
    finally:
        for worker in (first, second):
            if worker is not None:
                worker.stop()


def test_a_worker_whose_model_cannot_be_loaded_exits_saying_why(
        broker: Any, unique_prefix: str, tmp_path: Path) -> None:
    missing = tmp_path / "no-such-model.pt"
    settings = make_settings(broker.bootstrap_servers, unique_prefix, tmp_path,
                             model_path=str(missing))
    asyncio.run(ensure_topics(settings))
    done = subprocess.run([sys.executable, "-m", "sibylla", "worker"], capture_output=True,
                          text=True, timeout=120, env={**os.environ, **settings.to_env()})
    assert done.returncode != 0
    assert f"the model could not be loaded, the worker stops: model file not found: " \
           f"{missing}" in done.stdout + done.stderr
