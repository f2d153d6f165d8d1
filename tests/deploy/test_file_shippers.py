"""The shipped tailer configs (deploy/rsyslog, deploy/syslog-ng) ship Slurm output files to
sibylla.logs, and a worker decides on what they shipped. Also pins down which brokers Debian's
librdkafka 2.0.2 (rsyslog's omkafka, syslog-ng's kafka-c, kcat) can talk to. Skipped only where
a tailer or kcat is missing (``deploy/test-packages.sh`` installs them)."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer

from sibylla.schemas.records import JobEvent, parse_log_record
from sibylla.settings import Settings
from sibylla.streams.keys import partition_of
from sibylla.streams.ship import Shipper
from tests.integration.fixtures import (
    NONDETERMINISTIC_LOG,
    collect_decisions,
    make_settings,
    only_brokers,
    start_worker,
)

ROOT = Path(__file__).resolve().parents[2]
OMKAFKA = Path("/usr/lib/x86_64-linux-gnu/rsyslog/omkafka.so")
# syslog-ng and rsyslog exclude each other as Debian packages: deploy/test-packages.sh unpacks
# syslog-ng here (a syslog-ng installed the usual way is used when there is one).
SYSLOG_NG_UNPACKED = Path("/opt/sibylla-test/syslog-ng")

pytestmark = pytest.mark.integration

needs_kcat = pytest.mark.skipif(shutil.which("kcat") is None,
                                reason="kcat is not installed (apt-get install kcat)")


def _rsyslogd(out: Path, work: Path, env: dict[str, str]) -> list[str]:
    """rsyslogd's command line with the shipped config, after checking the config."""
    config = ROOT / "deploy" / "rsyslog" / "sibylla-slurm.conf"
    if shutil.which("rsyslogd") is None or not OMKAFKA.exists():
        pytest.skip("rsyslog with omkafka is not installed (apt-get install rsyslog "
                    "rsyslog-kafka)")
    env.update(SIBYLLA_OUTPUT_GLOB=f"{out}/*.out", SIBYLLA_WORK_DIR=str(work))
    check = subprocess.run(["rsyslogd", "-N1", "-f", str(config)], env=env,
                           capture_output=True, text=True, check=False)
    assert check.returncode == 0, check.stderr
    return ["rsyslogd", "-n", "-f", str(config), "-i", str(work / "pid")]


def _syslog_ng(out: Path, work: Path, env: dict[str, str]) -> list[str]:
    """syslog-ng's command line with the shipped config, after checking the config."""
    config = ROOT / "deploy" / "syslog-ng" / "sibylla-slurm.conf"
    kafka_c = [*Path("/").glob("usr/lib/syslog-ng/*/libkafka.so"),
               *SYSLOG_NG_UNPACKED.glob("usr/lib/syslog-ng/*/libkafka.so")]
    if not kafka_c:
        pytest.skip("syslog-ng with kafka-c is not installed (deploy/test-packages.sh unpacks "
                    "syslog-ng-core and syslog-ng-mod-rdkafka)")
    modules = kafka_c[0].parent
    root = modules.parents[3]
    env.update(SIBYLLA_OUTPUT_DIR=str(out), SIBYLLA_OUTPUT_PATTERN="*.out",
               LD_LIBRARY_PATH=str(modules.parent))
    command = [str(root / "usr/sbin/syslog-ng"), "-f", str(config), f"--module-path={modules}"]
    check = subprocess.run([*command, "--syntax-only"], env=env, capture_output=True,
                           text=True, check=False)
    assert check.returncode == 0, check.stderr
    return [*command, "-F", f"--persist-file={work / 'persist'}",
            f"--pidfile={work / 'pid'}", f"--control={work / 'ctl'}"]


TAILERS = {"rsyslog": _rsyslogd, "syslog-ng": _syslog_ng}


@pytest.fixture(params=sorted(TAILERS))
def tailer(request: pytest.FixtureRequest, tmp_path: Path, unique_prefix: str,
           broker: object) -> Iterator[tuple[Path, Settings, str]]:
    """A tailer with its shipped config, following ``<tmp>/out/*.out``; its settings and
    name."""
    settings = make_settings(broker.bootstrap_servers,  # type: ignore[attr-defined]
                             unique_prefix, tmp_path)
    out, work = tmp_path / "out", tmp_path / "tailer"
    out.mkdir()
    work.mkdir()
    env = {**os.environ, "SIBYLLA_BOOTSTRAP_SERVERS": settings.bootstrap_servers,
           "SIBYLLA_TOPIC": settings.topic("logs")}
    command = TAILERS[request.param](out, work, env)
    log = open(tmp_path / "tailer.log", "ab")  # noqa: SIM115
    proc = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        yield out, settings, request.param
    finally:
        proc.terminate()
        proc.wait(15)
        log.close()


async def _records(settings: Settings, expected: int, timeout_s: float = 60.0) -> list:
    consumer = AIOKafkaConsumer(settings.topic("logs"),
                                bootstrap_servers=settings.bootstrap_servers,
                                auto_offset_reset="earliest", enable_auto_commit=False)
    await consumer.start()
    found: list = []
    deadline = time.monotonic() + timeout_s
    try:
        while len(found) < expected and time.monotonic() < deadline:
            for records in (await consumer.getmany(timeout_ms=500)).values():
                found += records
    finally:
        await consumer.stop()
    return found


@only_brokers("kafka")
def test_a_tailer_ships_slurm_output_files_to_the_jobs_partition_and_the_worker_decides(
        tailer: tuple[Path, Settings, str], tmp_path: Path) -> None:
    out, settings, _ = tailer
    worker = start_worker(settings, tmp_path)
    try:
        time.sleep(1.0)  # the tailers watch the directory from their start: files come after
        # No job id in these names (written first, so that their lines, were they shipped,
        # would come before the jobs' lines): the digits of a name, and a job array's task
        # index (sweep-%A_%a.out), which named job 3 until session 30.
        for name in ("notes.out", "resnet50.out", "sweep-1001_3.out"):
            (out / name).write_text(f"{name}: not shipped\n")
        jobs = {str(job_id): f"train-{job_id}.out" for job_id in (1001, 1002, 1003, 1004)}
        for name in jobs.values():
            (out / name).write_text(NONDETERMINISTIC_LOG + "\n")
        (out / "train-1001.1.out").write_text("Epoch 4: resumed\n")  # attempt 1, by name
        lines = len(NONDETERMINISTIC_LOG.splitlines())
        records = asyncio.run(_records(settings, lines * len(jobs) + 1))
        assert len(records) == lines * len(jobs) + 1
        by_attempt: dict[tuple[str, int], list[str]] = {}
        for r in records:
            chunk = parse_log_record(r.value, settings.max_line_bytes)
            assert r.key == chunk.job_id.encode()
            # murmur2, as Java's client and aiokafka: the job's events land on this partition.
            assert r.partition == partition_of(chunk.job_id, settings.partitions)
            by_attempt.setdefault((chunk.job_id, chunk.attempt), []).extend(chunk.lines)
        assert set(by_attempt) == {*((job, 0) for job in jobs), ("1001", 1)}
        assert by_attempt[("1001", 0)] == NONDETERMINISTIC_LOG.splitlines()
        assert by_attempt[("1001", 1)] == ["Epoch 4: resumed"]

        async def finish() -> list:
            async with Shipper(settings) as shipper:
                await shipper.send_event(JobEvent("1002", 0, "finished", "FAILED", 1))
                await shipper.flush()
            return await collect_decisions(settings, {"1002"}, timeout_s=60)

        decisions = asyncio.run(finish())
        assert [(d.job_id, d.line_count, d.verdict) for d in decisions] == [
            ("1002", lines, "nondeterministic")]
    finally:
        worker.stop()


@only_brokers("kafka")
def test_a_line_longer_than_the_workers_limit_arrives_within_it(
        tailer: tuple[Path, Settings, str]) -> None:
    """A tensor printed on one line, a JSON blob: longer than ``max_line_bytes`` (16 KiB), a
    line is dead-lettered by the worker. syslog-ng cuts it into pieces of that size and loses
    nothing; rsyslog's imfile keeps its first 16 KiB and drops the rest (its split applies to
    multi-line read modes only), where with its default 8 KiB limit it kept half as much."""
    out, settings, name = tailer
    time.sleep(1.0)
    long_line = "".join(f"{i:05d} " for i in range(7000))  # 42,000 bytes
    (out / "train-3001.out").write_text(f"{long_line}\nKeyError: 'lr'\n")
    pieces = {"syslog-ng": 4, "rsyslog": 2}[name]
    records = asyncio.run(_records(settings, pieces, timeout_s=30))
    lines = [line for r in records  # each within the limit, or this raises
             for line in parse_log_record(r.value, settings.max_line_bytes).lines]
    assert lines[-1] == "KeyError: 'lr'"
    if name == "syslog-ng":
        assert "".join(lines[:-1]) == long_line
    else:
        assert lines[:-1] == [long_line[:settings.max_line_bytes]]


@needs_kcat
def test_debians_librdkafka_talks_to_apache_kafka_but_not_to_tansu(broker: object) -> None:
    """librdkafka 2.0.2 fails Tansu 0.6.0's ApiVersions answer ("Read underflow"): shippers
    built on it (rsyslog, syslog-ng, kcat) need Apache Kafka (README: Shippers)."""
    done = subprocess.run(["kcat", "-b", broker.bootstrap_servers,  # type: ignore[attr-defined]
                           "-L", "-m", "5"], capture_output=True, text=True, timeout=30,
                          check=False)
    if broker.name == "tansu":  # type: ignore[attr-defined]
        assert done.returncode != 0 and "Read underflow" in done.stderr
    else:
        assert done.returncode == 0, done.stderr
        assert "broker" in done.stdout
