"""Helpers for the integration tests: settings, workers and readers on a real broker."""

from __future__ import annotations

import asyncio
import base64
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import orjson
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from sibylla.brokers.process import free_port
from sibylla.schemas.records import Decision, JobEvent
from sibylla.settings import Settings
from sibylla.streams.follow import follow, follow_decisions
from sibylla.streams.launch import WorkerProcess
from sibylla.streams.ship import Shipper
from sibylla.streams.topics import ensure_topics

DETERMINISTIC_LOG = """\
[rank0]: Traceback (most recent call last):
[rank0]:   File "/home/user/train.py", line 88, in <module>
[rank0]:     main(args)
[rank0]:   File "/home/user/train.py", line 61, in main
[rank0]:     output = model(batch)
[rank0]: RuntimeError: mat1 and mat2 shapes cannot be multiplied (64x512 and 1024x10)"""

NONDETERMINISTIC_LOG = """\
Epoch 3: 41%|████      | 410/1000 [12:01<17:18, 1.76s/it, loss=2.31]
[rank3]:[E ProcessGroupNCCL.cpp:563] [Rank 3] Watchdog caught collective operation timeout: \
WorkNCCL(SeqNum=48211, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=1800000) ran for \
1800092 milliseconds before timing out.
[rank3]:[E ProcessGroupNCCL.cpp:1537] [PG 0 Rank 3] Timeout at NCCL work: 48211, last enqueued \
NCCL work: 48211, last completed NCCL work: 48210.
terminate called after throwing an instance of 'c10::DistBackendError'"""


def only_brokers(*names: str) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Run an integration test only on these brokers (conftest's parametrization reads it):
    e.g. a crash test needs a broker that keeps its data on disk."""
    def mark(fn: Callable[..., None]) -> Callable[..., None]:
        fn.only_brokers = names  # type: ignore[attr-defined]
        return fn
    return mark


async def create_topic_taking_at_most(settings: Settings, name: str, max_bytes: int,
                                      partitions: int = 1) -> None:
    """A topic whose broker refuses record batches over ``max_bytes`` (Apache Kafka enforces
    ``max.message.bytes``; Tansu ignores it)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=settings.bootstrap_servers,
                                **settings.kafka_client_options())
    await admin.start()
    try:
        await admin.create_topics([NewTopic(name, partitions, settings.replication_factor,
                                            topic_configs={"max.message.bytes": str(max_bytes)})])
    finally:
        await admin.close()


def make_settings(bootstrap: str, prefix: str, workdir: Path, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "bootstrap_servers": bootstrap, "topic_prefix": prefix, "group_id": prefix + "workers",
        "slurm_actuator_group": prefix + "slurm-actuator",
        "store": "memory", "data_dir": str(workdir / "worker"), "web_port": free_port(),
        "slurm_actuator_metrics_port": free_port(), "grace_period_s": 0.5, "partitions": 4,
        # A candidate model can be tested with SIBYLLA_MODEL_PATH; default: the shipped one.
        "model_path": os.environ.get("SIBYLLA_MODEL_PATH", ""),
        # On a GPU box too, so that tests see the same device as CI's (the CUDA path is
        # checked by bench/device_agreement.py).
        "device": "cpu",
    }
    values.update(overrides)
    return Settings.from_env({}, **{k: str(v) for k, v in values.items()})


def start_worker(settings: Settings, workdir: Path, name: str = "worker",
                 extra_env: Mapping[str, str] | None = None) -> WorkerProcess:
    """A started worker; ``extra_env``: more ``SIBYLLA_*`` variables (online learning's)."""
    asyncio.run(ensure_topics(settings))
    return WorkerProcess(settings, workdir / f"{name}.log", extra_env).start()


async def ship_job(shipper: Shipper, job_id: str, log: str | None, state: str,
                   nodes: tuple[str, ...] = ("gpu-a01",), eos: bool = True) -> None:
    """A job's log (marked end of stream unless ``eos`` is false: then the worker waits out
    the grace period for more) and its termination event, as a shipper and a scheduler hook
    would send them."""
    if log is not None:
        await shipper.send_lines(job_id, log.splitlines(), eos=eos)
    await shipper.send_event(JobEvent(job_id, 0, "finished", state,
                                      0 if state == "COMPLETED" else 1, None, nodes, 8))


async def collect_decisions(settings: Settings, expected: set[str], timeout_s: float
                            ) -> list[Decision]:
    """Every decision on the topic until each expected job has one (or the timeout)."""
    found: list[Decision] = []
    deadline = time.monotonic() + timeout_s

    async def read() -> None:
        async for decision in follow_decisions(settings, from_beginning=True):
            found.append(decision)
            if expected <= {d.job_id for d in found}:
                return

    try:
        await asyncio.wait_for(read(), timeout=max(0.1, deadline - time.monotonic()))
    except TimeoutError:
        pass
    return found


async def read_all(settings: Settings, topic_name: str, idle_s: float = 3.0
                   ) -> list[dict[str, Any]]:
    """All JSON records of a topic, until it stays idle for ``idle_s``."""
    return [record async for record in follow(settings, topic_name, orjson.loads,
                                              from_beginning=True, idle_timeout_s=idle_s)]


def decoded(letter: dict[str, Any]) -> bytes | None:
    """A dead letter's original value (None for a tombstone; an excerpt when truncated)."""
    value = letter["value_b64"]
    return None if value is None else base64.b64decode(value)


def metric(text: str, name: str) -> float:
    """The value of an unlabelled metric in Prometheus text format (0 when absent)."""
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return 0.0
