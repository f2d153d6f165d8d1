"""The documented ACLs (sibylla/brokers/acls.py) against Apache Kafka with SASL/SCRAM and the
KRaft StandardAuthorizer: a shipper writes logs but not models or decisions, no principal but
the worker writes decisions, a worker decides end to end with least privilege, the trainer
announces a signed model the worker swaps in, the Slurm actuator follows decisions in its group
as the scheduler; and no secret of the run (SASL passwords, the
operator's token, the signing key) appears in the worker's or the trainer's log, the
worker's metrics, or any record of any topic (decisions and dead letters included)."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import GroupCoordinatorNotAvailableError, TopicAuthorizationFailedError

from sibylla.brokers.acls import apply_acls, bindings
from sibylla.brokers.launchers import SUPER_USER, apache_kafka
from sibylla.brokers.process import BrokerProcess, free_port
from sibylla.inference.checkpoint import save_checkpoint
from sibylla.online_learning.settings import OnlineSettings
from sibylla.online_learning.signing import generate_key_pair
from sibylla.schemas.records import Decision, JobEvent
from sibylla.settings import Settings
from sibylla.streams.ship import Shipper
from sibylla.streams.topics import ensure_topics
from tests.integration.fixtures import DETERMINISTIC_LOG, collect_decisions, make_settings
from tests.online_learning.fixtures import examples, tiny_checkpoint

pytestmark = pytest.mark.integration

ROLES = ("shipper", "scheduler", "worker", "trainer")
# Known secret values, so that every output can be searched for them.
PASSWORDS = {user: f"{user}-pw-{uuid.uuid4().hex}" for user in (SUPER_USER, *ROLES)}
TOKEN = f"operator-token-{uuid.uuid4().hex}"


@pytest.fixture(scope="module")
def secure_kafka(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
                 ) -> Iterator[tuple[BrokerProcess, int]]:
    """Apache Kafka with a SASL/SCRAM listener, the StandardAuthorizer and a user per role."""
    if "kafka" not in request.config.getoption("--brokers").split(","):
        pytest.skip("the ACL tests run on Apache Kafka (--brokers kafka)")
    if shutil.which("java") is None or shutil.which("mvn") is None:
        pytest.skip("Apache Kafka needs java and mvn on PATH")
    sasl_port = free_port()
    broker = apache_kafka(tmp_path_factory.mktemp("secure-kafka"), scram_users=PASSWORDS,
                          sasl_port=sasl_port)
    with broker:
        yield broker, sasl_port


def as_user(secure: tuple[BrokerProcess, int], user: str, prefix: str, workdir: Path,
            **overrides: Any) -> Settings:
    return make_settings(f"127.0.0.1:{secure[1]}", prefix, workdir,
                         security_protocol="SASL_PLAINTEXT", sasl_mechanism="SCRAM-SHA-512",
                         sasl_username=user, sasl_password=PASSWORDS[user], **overrides)


def with_acls(secure: tuple[BrokerProcess, int], prefix: str, workdir: Path) -> Settings:
    """Topics and the documented ACLs of every role, made by the admin; the admin's settings."""
    admin = as_user(secure, SUPER_USER, prefix, workdir)
    asyncio.run(ensure_topics(admin))
    asyncio.run(apply_acls(admin, bindings(admin, {role: role for role in ROLES})))
    return admin


async def refused(settings: Settings, topic: str) -> bool:
    """Whether the broker refuses ``settings``' user a write to ``topic``."""
    producer = AIOKafkaProducer(bootstrap_servers=settings.bootstrap_servers,
                                **settings.kafka_client_options())
    await producer.start()
    try:
        await producer.send_and_wait(settings.topic(topic), b"{}", key=b"job")
        return False
    except TopicAuthorizationFailedError:
        return True
    finally:
        await producer.stop()


def test_a_shipper_writes_logs_and_only_the_worker_writes_decisions(
        secure_kafka: tuple[BrokerProcess, int], unique_prefix: str, tmp_path: Path) -> None:
    with_acls(secure_kafka, unique_prefix, tmp_path)
    shipper = as_user(secure_kafka, "shipper", unique_prefix, tmp_path)
    assert not asyncio.run(refused(shipper, "logs"))
    assert asyncio.run(refused(shipper, "models"))
    for role in ("shipper", "scheduler", "trainer"):
        assert asyncio.run(refused(as_user(secure_kafka, role, unique_prefix, tmp_path),
                                   "decisions")), role
    assert not asyncio.run(refused(as_user(secure_kafka, "trainer", unique_prefix, tmp_path),
                                   "models"))


async def all_records(admin: Settings) -> bytes:
    """Every record (keys and values) of every topic of this test, read as the admin."""
    client = AIOKafkaAdminClient(bootstrap_servers=admin.bootstrap_servers,
                                 **admin.kafka_client_options())
    await client.start()
    try:
        topics = [t for t in await client.list_topics()
                  if t.startswith((admin.topic_prefix, admin.group_id))]
        tps = [TopicPartition(info["topic"], p["partition"])
               for info in await client.describe_topics(topics) for p in info["partitions"]]
    finally:
        await client.close()
    consumer = AIOKafkaConsumer(bootstrap_servers=admin.bootstrap_servers, group_id=None,
                                enable_auto_commit=False, **admin.kafka_client_options())
    await consumer.start()
    try:
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends = await consumer.end_offsets(tps)
        out = bytearray()
        async def behind() -> bool:
            return any([await consumer.position(tp) < end for tp, end in ends.items()])

        while await behind():
            for records in (await consumer.getmany(timeout_ms=1000)).values():
                for r in records:
                    out += (r.key or b"") + b"\n" + (r.value or b"") + b"\n"
        assert len(topics) >= 8, topics
        return bytes(out)
    finally:
        await consumer.stop()


def test_least_privilege_worker_and_trainer_run_end_to_end_and_leak_no_secret(
        secure_kafka: tuple[BrokerProcess, int], unique_prefix: str, tmp_path: Path) -> None:
    admin = with_acls(secure_kafka, unique_prefix, tmp_path)
    key_path = tmp_path / "trainer.key"
    _, public_key = generate_key_pair(key_path)
    tokens = tmp_path / "operators"
    tokens.write_text(f"alice:{TOKEN}\n")
    tokens.chmod(0o600)
    online = OnlineSettings(models_dir=tmp_path / "models", model_signing_key=str(key_path),
                            model_public_key=public_key, operator_tokens_file=str(tokens),
                            trainer_metrics_port=0)
    worker_settings = as_user(secure_kafka, "worker", unique_prefix, tmp_path)
    from sibylla.streams.launch import WorkerProcess

    with WorkerProcess(worker_settings, tmp_path / "worker.log", online.to_env()) as worker:

        async def ship_and_decide() -> list[Any]:
            shipper = as_user(secure_kafka, "shipper", unique_prefix, tmp_path)
            scheduler = as_user(secure_kafka, "scheduler", unique_prefix, tmp_path)
            async with Shipper(shipper) as logs:
                await logs.send_lines("job-acl", DETERMINISTIC_LOG.splitlines(), eos=True)
                await logs.send_raw(shipper.topic("logs"), b"job-acl", b"not json")
                await logs.flush()
            async with Shipper(scheduler) as events:
                await events.send_event(JobEvent("job-acl", 0, "finished", "FAILED", 1))
                await events.flush()
            return await collect_decisions(scheduler, {"job-acl"}, timeout_s=90)

        decisions = asyncio.run(ship_and_decide())
        assert [d.job_id for d in decisions] == ["job-acl"], worker.tail()

        # An operator's label goes through the worker's label-votes and labels topics.
        request = urllib.request.Request(
            f"http://127.0.0.1:{worker.settings.web_port}/labels/job-acl/0",
            data=b'{"label": "deterministic"}', method="POST",
            headers={"Content-Type": "application/json", "Authorization": f"Bearer {TOKEN}"})
        with urllib.request.urlopen(request, timeout=10) as resp:
            assert resp.status == 202

        # The trainer, as its own principal, announces its (tiny) base model, signed; the
        # worker loads it from the models directory.
        tiny = tiny_checkpoint(examples(16), version="tiny-acl")
        base = save_checkpoint(tiny.model, tiny.vocab, tiny.meta, tmp_path / "base.safetensors")
        trainer_settings = as_user(secure_kafka, "trainer", unique_prefix, tmp_path,
                                   model_path=str(base))
        trainer_log = tmp_path / "trainer.log"
        with open(trainer_log, "wb") as out:
            trainer = subprocess.Popen(
                [sys.executable, "-m", "sibylla", "trainer", "--models-dir",
                 str(online.models_dir)], stdout=out, stderr=subprocess.STDOUT,
                env={**os.environ, **online.to_env(), **trainer_settings.to_env()})
        try:
            deadline = time.monotonic() + 120
            swapped = 'sibylla_model_info{device="cpu",version="tiny-acl"} 1.0'
            while swapped not in worker.metrics_text() and time.monotonic() < deadline:
                assert trainer.poll() is None, trainer_log.read_text()[-3000:]
                time.sleep(0.5)
            assert swapped in worker.metrics_text(), worker.tail() + trainer_log.read_text()
        finally:
            trainer.terminate()
            trainer.wait(30)

        def labelled() -> bool:
            return b'"by":"alice"' in asyncio.run(all_records(admin))

        deadline = time.monotonic() + 60
        while not labelled() and time.monotonic() < deadline:
            time.sleep(1)
        assert labelled(), worker.tail()
        metrics = worker.metrics_text()

    outputs = {"worker log": (tmp_path / "worker.log").read_bytes(),
               "trainer log": trainer_log.read_bytes(), "metrics": metrics.encode(),
               "topics": asyncio.run(all_records(admin))}
    # Each output holds what the run did: the search below reads the real thing.
    assert b"bm90IGpzb24" in outputs["topics"]  # the dead letter of b"not json"
    assert b'"job_id":"job-acl"' in outputs["topics"]
    assert b"swapped in model tiny-acl" in outputs["worker log"]
    assert b"signed" in outputs["trainer log"] and b"unsigned" not in outputs["trainer log"]
    assert b"sasl_password" in outputs["worker log"]  # the settings line, masked
    private_pem = key_path.read_text().splitlines()[1].encode()
    secrets = [p.encode() for p in PASSWORDS.values()] + [TOKEN.encode(), private_pem]
    for where, text in outputs.items():
        for secret in secrets:
            assert secret not in text, f"a secret appears in the {where}"


async def committed(admin: Settings, group: str) -> dict[int, int]:
    """The offsets ``group`` committed on the decisions topic, by partition (as the admin)."""
    client = AIOKafkaAdminClient(bootstrap_servers=admin.bootstrap_servers,
                                 **admin.kafka_client_options())
    await client.start()
    try:
        offsets = await client.list_consumer_group_offsets(group)
    except GroupCoordinatorNotAvailableError:  # no offset committed yet on a fresh broker
        return {}
    finally:
        await client.close()
    return {tp.partition: meta.offset for tp, meta in offsets.items()
            if tp.topic == admin.topic("decisions")}


def test_the_slurm_actuator_runs_as_the_scheduler_principal(
        secure_kafka: tuple[BrokerProcess, int], unique_prefix: str, tmp_path: Path) -> None:
    """The actuator reads decisions in a consumer group of its own and commits what it
    handled; without a grant on that group the broker refused its join, and no decision
    reached Slurm on a cluster secured as documented."""
    admin = with_acls(secure_kafka, unique_prefix, tmp_path)
    worker = as_user(secure_kafka, "worker", unique_prefix, tmp_path)
    decision = Decision("4242", 0, "deterministic", 0.99, "import_error", "do_not_retry", [],
                        [], "m", time.time(), 1.0, state="FAILED")

    async def publish() -> None:
        async with Shipper(worker) as shipper:
            await shipper.send_raw(worker.topic("decisions"), b"4242", decision.to_json())
            await shipper.flush()

    asyncio.run(publish())
    scheduler = as_user(secure_kafka, "scheduler", unique_prefix, tmp_path,
                        slurm_actuator_metrics_port=0)
    audit = tmp_path / "audit.jsonl"
    env = {**os.environ, **scheduler.to_env(), "SIBYLLA_SLURM_AUDIT_FILE": str(audit),
           # No Slurm here: scontrol fails, so the decision is reported failed and committed.
           "SIBYLLA_SLURM_SCONTROL": "false"}
    with open(tmp_path / "actuator.log", "wb") as out:
        actuator = subprocess.Popen([sys.executable, "-m", "sibylla", "slurm", "actuator"],
                                    stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.monotonic() + 60
        while not asyncio.run(committed(admin, scheduler.slurm_actuator_group)):
            log = (tmp_path / "actuator.log").read_text()
            assert actuator.poll() is None and time.monotonic() < deadline, log[-3000:]
            time.sleep(0.5)
    finally:
        actuator.terminate()
        actuator.wait(30)
    assert sum(asyncio.run(committed(admin, scheduler.slurm_actuator_group)).values()) == 1
    assert [orjson.loads(line)["job_id"] for line in audit.read_bytes().splitlines()] == ["4242"]
