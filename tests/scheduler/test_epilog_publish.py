"""``sibylla slurm epilog`` run the way slurmctld runs it (a process with SLURM_JOB_* variables),
against a real broker: what it publishes for each attempt of an appended output file, and that
it still publishes when scontrol does not answer."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
from aiokafka.errors import KafkaTimeoutError

from sibylla.scheduler.epilog import Spooled, drain_spool, run_epilog
from sibylla.schemas.records import parse_log_record
from sibylla.settings import Settings
from sibylla.streams.ship import Shipper
from sibylla.streams.topics import ensure_topics
from tests.integration.fixtures import (
    create_topic_taking_at_most,
    make_settings,
    only_brokers,
    read_all,
)

pytestmark = pytest.mark.integration


def _slurm_env(tmp_path: Path, attempt: int, exit_code2: str, job_id: str) -> dict[str, str]:
    """What slurmctld puts into EpilogSlurmctld's environment for one attempt."""
    return {"SLURM_JOB_ID": job_id, "SLURM_JOB_RESTART_COUNT": str(attempt),
            "SLURM_JOB_EXIT_CODE2": exit_code2, "SLURM_JOB_NODELIST": "gpu01,gpu02",
            "SLURM_JOB_NAME": "train", "SLURM_JOB_WORK_DIR": str(tmp_path),
            "SLURM_JOB_STDOUT": "out/%x-%j.out"}


def _epilog(settings: Settings, tmp_path: Path, attempt: int, exit_code2: str,
            job_id: str = "9001") -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **settings.to_env(),
           # scontrol is not there (a controller under load, a broken PATH): `false` fails.
           "SIBYLLA_SLURM_SCONTROL": "false",
           "SIBYLLA_SLURM_EPILOG_STATE_DIR": str(tmp_path / "state"),
           **_slurm_env(tmp_path, attempt, exit_code2, job_id)}
    return subprocess.run([sys.executable, "-m", "sibylla", "slurm", "epilog"], env=env,
                          capture_output=True, text=True, timeout=60, check=False)


def _two_failed_jobs(broker: object, unique_prefix: str, tmp_path: Path) -> Settings:
    """Settings on ``broker`` with its topics made, and the output files of two failed jobs
    (9001: an NCCL timeout after an epoch, 9002: a KeyError)."""
    settings = make_settings(broker.bootstrap_servers,  # type: ignore[attr-defined]
                             unique_prefix, tmp_path)
    asyncio.run(ensure_topics(settings))
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "train-9001.out").write_text("epoch 1\nRuntimeError: NCCL timeout\n")
    (tmp_path / "out" / "train-9002.out").write_text("KeyError: 'lr'\n")
    return settings


def _drain_spool(settings: Settings, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **settings.to_env(),
           "SIBYLLA_SLURM_EPILOG_STATE_DIR": str(tmp_path / "state")}
    return subprocess.run([sys.executable, "-m", "sibylla", "slurm", "drain-spool"], env=env,
                          capture_output=True, text=True, timeout=60, check=False)


def test_each_attempt_of_an_appended_output_is_published_once_with_its_event(
        broker: object, unique_prefix: str, tmp_path: Path) -> None:
    settings = make_settings(broker.bootstrap_servers,  # type: ignore[attr-defined]
                             unique_prefix, tmp_path)
    asyncio.run(ensure_topics(settings))
    output = tmp_path / "out" / "train-9001.out"
    output.parent.mkdir()
    output.write_text("epoch 1\nRuntimeError: NCCL error: unhandled system error\n")
    first = _epilog(settings, tmp_path, 0, "1:0")
    assert first.returncode == 0, first.stderr
    assert "job 9001 attempt 0 FAILED (exit 1:0) on gpu01,gpu02: 2 lines shipped" in first.stderr
    with output.open("a") as f:  # --open-mode=append: the requeued attempt appends
        f.write("epoch 1\nepoch 2\nKeyError: 'lr'\n")
    second = _epilog(settings, tmp_path, 1, "2:0")
    assert second.returncode == 0, second.stderr

    logs = asyncio.run(read_all(settings, "logs", idle_s=2.0))
    chunks = [parse_log_record(orjson.dumps(r), settings.max_line_bytes) for r in logs]
    assert [(c.attempt, c.lines, c.eos) for c in chunks] == [
        (0, ["epoch 1", "RuntimeError: NCCL error: unhandled system error"], True),
        (1, ["epoch 1", "epoch 2", "KeyError: 'lr'"], True)]
    events = asyncio.run(read_all(settings, "job-events", idle_s=2.0))
    assert [(e["attempt"], e["state"], e["exit_code"], e["nodes"]) for e in events] == [
        (0, "FAILED", 1, ["gpu01", "gpu02"]), (1, "FAILED", 2, ["gpu01", "gpu02"])]


def test_without_a_broker_the_epilog_gives_up_within_its_bound(tmp_path: Path) -> None:
    settings = Settings.from_env({}, bootstrap_servers="127.0.0.1:9",  # nothing listens
                                 slurm_epilog_timeout_s=2.0)
    done = _epilog(settings, tmp_path, 0, "1:0")
    assert done.returncode == 1
    assert "sibylla epilog: job 9001: not published" in done.stderr


def test_an_epilog_not_told_the_brokers_says_so_and_keeps_nothing(tmp_path: Path) -> None:
    """Not a broker that is away: spooled, the attempt would wait for a broker no run of
    this configuration ever reaches, and slurmctld's log would say only "broker away"."""
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "train-9001.out").write_text("KeyError: 'lr'\n")
    done = _epilog(Settings.from_env({}), tmp_path, 0, "1:0")
    assert done.returncode == 1
    assert ("sibylla epilog: job 9001: not published: SettingsError: bootstrap_servers: "
            "required for the epilog") in done.stderr
    assert not (tmp_path / "state").exists()


@pytest.mark.parametrize("drainer", ["the next epilog", "drain-spool"])
def test_an_attempt_that_ends_while_the_broker_is_away_is_published_later_once(
        broker: object, unique_prefix: str, tmp_path: Path, drainer: str) -> None:
    """A failure that ended during a broker outage was never decided: the epilog gave up
    within its bound and the attempt was gone. It is now spooled, and the next epilog run
    (any job's) publishes it after its own attempt, or ``sibylla slurm drain-spool`` does
    once the broker is back; once."""
    settings = _two_failed_jobs(broker, unique_prefix, tmp_path)
    away = dataclasses.replace(settings, bootstrap_servers="127.0.0.1:9",  # nothing listens
                               slurm_epilog_timeout_s=2.0)
    missed = _epilog(away, tmp_path, 0, "1:0", job_id="9001")
    assert missed.returncode == 1
    assert "not published: Spooled: broker away" in missed.stderr

    if drainer == "drain-spool":
        still_away = _drain_spool(away, tmp_path)
        assert still_away.returncode == 1
        assert "0 spooled attempt(s) published, 1 left" in still_away.stderr
        drained = _drain_spool(settings, tmp_path)
        assert drained.returncode == 0, drained.stderr
        assert "1 spooled attempt(s) published, 0 left" in drained.stderr
    done = _epilog(settings, tmp_path, 0, "1:0", job_id="9002")
    assert done.returncode == 0, done.stderr
    assert ("1 spooled attempt(s) published" in done.stderr) == (drainer == "the next epilog")
    again = _epilog(settings, tmp_path, 1, "1:0", job_id="9002")
    assert again.returncode == 0 and "spooled" not in again.stderr, again.stderr

    logs = asyncio.run(read_all(settings, "logs", idle_s=2.0))
    chunks = [parse_log_record(orjson.dumps(r), settings.max_line_bytes) for r in logs]
    assert sorted((c.job_id, c.attempt, c.lines) for c in chunks) == [
        ("9001", 0, ["epoch 1", "RuntimeError: NCCL timeout"]),
        ("9002", 0, ["KeyError: 'lr'"]), ("9002", 1, [])]
    events = asyncio.run(read_all(settings, "job-events", idle_s=2.0))
    assert sorted((e["job_id"], e["attempt"], e["state"]) for e in events) == [
        ("9001", 0, "FAILED"), ("9002", 0, "FAILED"), ("9002", 1, "FAILED")]


@only_brokers("kafka")  # Tansu takes records over a topic's max.message.bytes
def test_a_log_the_broker_refuses_is_not_reported_shipped_nor_its_attempt_published(
        broker: object, unique_prefix: str, tmp_path: Path) -> None:
    settings = make_settings(broker.bootstrap_servers,  # type: ignore[attr-defined]
                             unique_prefix, tmp_path)
    asyncio.run(create_topic_taking_at_most(settings, settings.topic("logs"), 2048,
                                            settings.partitions))
    asyncio.run(ensure_topics(settings))
    output = tmp_path / "out" / "train-9001.out"
    output.parent.mkdir()
    output.write_text("epoch 1\n" + "x" * 4000 + "\nRuntimeError: CUDA error: an illegal "
                      "memory access was encountered\n")
    done = _epilog(settings, tmp_path, 0, "1:0")
    assert done.returncode == 1
    assert "job 9001: not published: DeliveryError" in done.stderr
    # No termination without its log: a worker would have decided on lines it never got.
    assert asyncio.run(read_all(settings, "job-events", idle_s=2.0)) == []
    assert not (tmp_path / "state").exists() or not any((tmp_path / "state").iterdir())


@only_brokers("kafka")  # Tansu takes records over a topic's max.message.bytes
def test_a_spooled_attempt_the_broker_refuses_is_set_aside_and_the_next_one_published(
        broker: object, unique_prefix: str, tmp_path: Path) -> None:
    """Spooled while the broker was away, then refused once it is back (its log over the
    topic's size limit): tried again first every time, it would hold back every attempt
    spooled after it."""
    settings = make_settings(broker.bootstrap_servers,  # type: ignore[attr-defined]
                             unique_prefix, tmp_path)
    asyncio.run(create_topic_taking_at_most(settings, settings.topic("logs"), 2048,
                                            settings.partitions))
    asyncio.run(ensure_topics(settings))
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "train-9001.out").write_text("x" * 4000 + "\nRuntimeError: boom\n")
    (tmp_path / "out" / "train-9002.out").write_text("KeyError: 'lr'\n")
    away = dataclasses.replace(settings, bootstrap_servers="127.0.0.1:9",  # nothing listens
                               slurm_epilog_timeout_s=2.0)
    for job_id in ("9001", "9002"):
        assert _epilog(away, tmp_path, 0, "1:0", job_id=job_id).returncode == 1

    drained = _drain_spool(settings, tmp_path)
    assert drained.returncode == 0, drained.stderr
    assert "1 spooled attempt(s) published, 0 left" in drained.stderr
    assert [p.name.endswith("-9001.0.bad") for p in (tmp_path / "state" / "spool").glob("*.bad")
            ] == [True]
    events = asyncio.run(read_all(settings, "job-events", idle_s=2.0))
    assert [(e["job_id"], e["state"]) for e in events] == [("9002", "FAILED")]


@pytest.mark.parametrize("held_by", ["its own epilog", "the spool"])
def test_an_attempt_whose_event_the_broker_missed_after_its_lines_gets_its_lines_once(
        broker: object, unique_prefix: str, tmp_path: Path, held_by: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The broker took the lines, then stopped answering before the event: the attempt is
    kept for later, but only its event; sending its lines again would put them twice into
    the job's window (and the classifier would read a log the job never printed)."""
    settings = _two_failed_jobs(broker, unique_prefix, tmp_path)
    in_process = dataclasses.replace(settings, slurm_scontrol="false",
                                     slurm_epilog_state_dir=tmp_path / "state")

    async def broker_gone(self: Shipper, event: object) -> None:
        raise KafkaTimeoutError("no answer within the request timeout")

    if held_by == "its own epilog":
        with monkeypatch.context() as patch:
            patch.setattr(Shipper, "send_event", broker_gone)
            with pytest.raises(Spooled, match=r"its event \(the broker holds its lines\) kept"):
                run_epilog(in_process, _slurm_env(tmp_path, 0, "1:0", "9001"))
    else:
        away = dataclasses.replace(settings, bootstrap_servers="127.0.0.1:9",
                                   slurm_epilog_timeout_s=2.0)
        assert _epilog(away, tmp_path, 0, "1:0", job_id="9001").returncode == 1
        with monkeypatch.context() as patch:
            patch.setattr(Shipper, "send_event", broker_gone)
            assert drain_spool(in_process) == (0, 1)
    done = _epilog(settings, tmp_path, 0, "1:0", job_id="9002")
    assert done.returncode == 0, done.stderr
    assert "1 spooled attempt(s) published" in done.stderr

    logs = asyncio.run(read_all(settings, "logs", idle_s=2.0))
    chunks = [parse_log_record(orjson.dumps(r), settings.max_line_bytes) for r in logs]
    assert sorted((c.job_id, c.lines, c.eos) for c in chunks) == [
        ("9001", ["epoch 1", "RuntimeError: NCCL timeout"], True),
        ("9002", ["KeyError: 'lr'"], True)]
    events = asyncio.run(read_all(settings, "job-events", idle_s=2.0))
    assert sorted((e["job_id"], e["attempt"], e["state"]) for e in events) == [
        ("9001", 0, "FAILED"), ("9002", 0, "FAILED")]
