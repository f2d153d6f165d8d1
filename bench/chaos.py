"""Fault campaign: crashes, rebalances, a broker restart and poison records, checked from the
topics alone.

    python bench/chaos.py --broker kafka            # the long campaign (README's figures)
    python bench/chaos.py --broker kafka --quick    # the short one CI runs

It starts a broker and two workers (RocksDB store), streams jobs the way shippers and scheduler
hooks do (one-line records, LogBatch records and a mix, each job's output ended with ``eos``,
then its termination: most FAILED, some COMPLETED), and meanwhile:

- SIGKILLs workers at random moments: one of the two most often (its partitions move to the
  other worker and back: rebalances), some again within seconds of their restart (kills during
  start-up and table recovery); every killed worker is restarted on its own data directory;
- restarts the broker mid-stream (Apache Kafka only: Tansu keeps its data in memory). The
  shippers pause while the broker is down, as a real shipper's retries would hold its lines;
  the workers do not: their jobs are in flight, windows open and terminations pending;
- interleaves fuzzed records with the valid ones: records built from the LogLine and LogBatch
  schemas with fields set to wrong types, out-of-range and 64-bit-overflowing numbers, or
  removed, plus hand-made poison (tombstones, invalid UTF-8, truncated and deeply nested JSON,
  NaN, non-objects, lines over the size limit) and poisoned job events.

Then it reads the decisions and dead-letter topics and checks what the README promises:
every failed attempt decided; no attempt with two different verdicts; every decision's line
count equal to the lines sent; no decision for a COMPLETED attempt; every bad record
dead-lettered (duplicates after a replay are counted, and are recognisable by the original's
topic, partition and offset) and no valid record dead-lettered; no worker exit that was not a
kill; the workers' peak RSS. Whether a fuzzed record is bad is decided by ``jsonschema`` on the
schema files, independently of the worker's own validators. Exit status 0 only when every check
holds.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import os
import random
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import jsonschema
import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from common import LinePool, Worker, topic_partitions

from sibylla.brokers.launchers import apache_kafka, tansu
from sibylla.brokers.process import BrokerProcess
from sibylla.schemas.validate import load_schema
from sibylla.settings import Settings
from sibylla.streams.lag import LagProbe
from sibylla.streams.topics import ensure_topics


@dataclass(frozen=True)
class Campaign:
    """What a campaign does; the defaults are the long run the README reports."""

    broker: str = "kafka"
    jobs: int = 300
    failed_share: float = 0.8
    kills: int = 50
    broker_restarts: int = 1
    fuzz: int = 100_000
    duration_s: float = 600.0
    settle_s: float = 240.0
    seed: int = 1
    partitions: int = 4
    max_line_bytes: int = 16384


QUICK = Campaign(jobs=60, kills=4, fuzz=10_000, duration_s=50.0, settle_s=150.0)

# Failure tails printed at the end of failed jobs: what the classifier decides on.
TAILS = (
    ["Traceback (most recent call last):", '  File "train.py", line 12, in <module>',
     "    from transformers import AutoModelForCausalLM",
     "ModuleNotFoundError: No module named 'transformers'"],
    ["[rank3]:[E ProcessGroupNCCL.cpp:563] [Rank 3] Watchdog caught collective operation "
     "timeout: WorkNCCL(SeqNum=48211, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, "
     "Timeout(ms)=1800000) ran for 1800092 milliseconds before timing out.",
     "terminate called after throwing an instance of 'c10::DistBackendError'"],
    ["torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a "
     "total capacity of 79.15 GiB of which 1.12 GiB is free."],
    ["NVRM: Xid (PCI:0000:3b:00): 79, pid=4412, GPU has fallen off the bus.",
     "RuntimeError: CUDA error: unspecified launch failure"],
)

# Values that break a field: wrong types, out of range, beyond 64 bits (orjson decodes
# 2**64 and -2**64 as floats, which both validators then see alike).
NASTY: tuple[Any, ...] = (None, -1, 1e20, 2**64, -(2**64), "", "x" * 300, {}, [], True,
                          3.5, [{"line": 5}], {"a": {"b": {}}}, "stdin")
POISON_EVENTS: tuple[bytes | None, ...] = (
    None,
    b'{"job_id": "fz", "event": "finished", "state": "FAILED", "exit_code": 1e20}',
    b'{"job_id": "fz", "event": "finished", "state": "FAILED", "gpus": 18446744073709551616}',
    b'{"job_id": "fz", "event": "finished", "attempt": -1}',
    b'{"job_id": "fz", "event": "finished", "state": "EXPLODED"}',
    b'{"job_id": "fz", "state": "FAILED"}',
    b"[1, 2, 3]",
    b'{"job_id": "fz", "event": "fin',
)


@dataclass(order=True)
class Send:
    """One record of the plan, at ``at`` seconds into the campaign."""

    at: float
    seq: int
    topic: str = field(compare=False)
    key: bytes = field(compare=False)
    value: bytes | None = field(compare=False)


@dataclass
class Truth:
    """What was sent, to check the topics against."""

    lines: dict[str, int] = field(default_factory=dict)  # job -> lines sent
    failed: set[str] = field(default_factory=set)
    completed: set[str] = field(default_factory=set)
    bad_keys: set[bytes] = field(default_factory=set)  # fuzzed records that must be refused
    good_fuzz_keys: set[bytes] = field(default_factory=set)


class Validity:
    """Ground truth for a fuzzed log record, from the schema files through ``jsonschema``."""

    def __init__(self, max_line_bytes: int) -> None:
        self.max_line_bytes = max_line_bytes
        self.logline = load_schema("logline.schema.json")
        self.logbatch = load_schema("logbatch.schema.json")
        self.eos_marker = {**self.logline, "required": ["job_id"]}

    def valid(self, value: bytes | None) -> bool:
        if value is None:
            return False
        try:
            record = json.loads(value.decode("utf-8"), parse_constant=_refuse)
        except Exception:  # noqa: BLE001 - undecodable, not JSON, too deep: all invalid
            return False
        if not isinstance(record, dict):
            return False
        if "lines" in record:
            schema = self.logbatch
        elif "line" not in record and record.get("eos") is True:
            schema = self.eos_marker
        else:
            schema = self.logline
        try:
            jsonschema.validate(record, schema)
        except jsonschema.ValidationError:
            return False
        lines = record["lines"] if "lines" in record else [record] if "line" in record else []
        return all(len(e["line"].encode()) <= self.max_line_bytes for e in lines)


def _refuse(constant: str) -> Any:
    raise ValueError(f"{constant} is not JSON")


def fuzz_log_record(rng: random.Random, validity: Validity) -> bytes | None:
    """A log record that may or may not be valid: a schema-shaped record with a few fields
    broken, or hand-made poison."""
    job = f"fuzz-job-{rng.randrange(40)}"
    roll = rng.random()
    if roll < 0.04:
        return None  # tombstone
    if roll < 0.08:
        return b'{"job_id": "' + job.encode() + b'", "line": "\xff\xfe broken"}'
    if roll < 0.11:
        return b'{"job_id": "' + job.encode() + b'", "line": "cut'
    if roll < 0.13:
        return b"[" * 3000 + b"]" * 3000
    if roll < 0.15:
        return rng.choice([b"[]", b"42", b'"a string"', b"null", b"", b'{"line": NaN}'])
    if roll < 0.16:
        return orjson.dumps({"job_id": job, "line": "z" * (validity.max_line_bytes + 10)})
    line = {"line": f"fuzz line {rng.random():.6f}", "stream": "stdout", "ts": time.time(),
            "host": "gpu-a01", "rank": rng.randrange(8)}
    record: dict[str, Any] = (
        {"job_id": job, "attempt": 0, "lines": [dict(line) for _ in range(rng.randint(1, 4))]}
        if rng.random() < 0.5 else {"job_id": job, "attempt": 0, **line})
    for _ in range(rng.choice((0, 1, 1, 2))):
        entries = [e for e in record.get("lines", ()) if isinstance(e, dict)] \
            if isinstance(record.get("lines"), list) else []
        target = rng.choice(entries) if entries and rng.random() < 0.5 else record
        name = rng.choice(list(target) + ["eos"])
        if rng.random() < 0.2:
            target.pop(name, None)
        else:
            target[name] = copy.deepcopy(rng.choice(NASTY))  # NASTY's own objects stay intact
    return json.dumps(record).encode()


def plan(c: Campaign, settings: Settings) -> tuple[list[Send], Truth]:
    """Every record the campaign sends, in time order, and what that should lead to."""
    rng = random.Random(c.seed)
    pool = LinePool(20_000)
    validity = Validity(c.max_line_bytes)
    truth = Truth()
    sends: list[Send] = []
    logs, events = settings.topic("logs"), settings.topic("job-events")
    seq = 0

    def add(at: float, topic: str, key: bytes, value: bytes | None) -> None:
        nonlocal seq
        seq += 1
        sends.append(Send(at, seq, topic, key, value))

    for i in range(c.jobs):
        job = f"job-{c.seed}-{i:04d}"
        failed = rng.random() < c.failed_share
        lines = pool.take(job, rng.randint(20, 300)) + (list(rng.choice(TAILS)) if failed
                                                        else ["training finished"])
        start = rng.uniform(0.0, 0.85 * c.duration_s)
        span = rng.uniform(1.0, 0.12 * c.duration_s)
        mode = rng.choice(("lines", "batches", "mixed"))
        chunks: list[list[str]] = []
        n = 0
        while n < len(lines):
            size = 1 if mode == "lines" or (mode == "mixed" and rng.random() < 0.5) \
                else rng.randint(2, 64)
            chunks.append(lines[n:n + size])
            n += size
        for k, chunk in enumerate(chunks):
            at = start + span * k / len(chunks)
            last = k == len(chunks) - 1
            if len(chunk) == 1 and mode != "batches":
                record: dict[str, Any] = {"job_id": job, "line": chunk[0], "stream": "stdout"}
            else:
                record = {"job_id": job, "lines": [{"line": ln} for ln in chunk]}
            if last:
                record["eos"] = True
            add(at, logs, job.encode(), orjson.dumps(record))
        state = "FAILED" if failed else "COMPLETED"
        add(start + span + rng.uniform(0.0, 0.5), events, job.encode(), orjson.dumps(
            {"job_id": job, "attempt": 0, "event": "finished", "state": state,
             "exit_code": 1 if failed else 0, "nodes": [f"gpu-a{rng.randrange(16):02d}"],
             "gpus": 8}))
        truth.lines[job] = len(lines)
        (truth.failed if failed else truth.completed).add(job)
    for n in range(c.fuzz):
        key = f"fuzz-{n}".encode()
        at = rng.uniform(0.0, c.duration_s)
        if rng.random() < 0.1:
            add(at, events, key, rng.choice(POISON_EVENTS))
            truth.bad_keys.add(key)
            continue
        value = fuzz_log_record(rng, validity)
        add(at, logs, key, value)
        (truth.good_fuzz_keys if validity.valid(value) else truth.bad_keys).add(key)
    sends.sort()
    return sends, truth


# ----------------------------------------------------------------------------- running it

@dataclass
class Observed:
    """What happened to the processes during the campaign."""

    kills: int = 0
    startup_kills: int = 0
    broker_restarts: int = 0
    unexpected_exits: list[str] = field(default_factory=list)
    peak_rss_mib: float = 0.0
    sent: int = 0


class Fleet:
    """The workers: killed and restarted on their own data directories, watched for exits
    that were not kills and for their peak RSS."""

    def __init__(self, settings: Settings, workdir: Path, count: int,
                 observed: Observed) -> None:
        self.observed = observed
        self.workers = [Worker({**settings.to_env(),
                                "SIBYLLA_DATA_DIR": str(workdir / f"worker-{i}")},
                               workdir / f"worker-{i}.log") for i in range(count)]

    def start(self) -> None:
        for worker in self.workers:
            worker.start()

    def kill(self, index: int) -> None:
        self.workers[index].kill()
        self.observed.kills += 1

    def watch(self) -> None:
        """Restart a worker that exited by itself (a supervisor's job), and note it."""
        for i, worker in enumerate(self.workers):
            proc = worker.proc
            if proc is None:
                continue
            if proc.poll() is not None:
                tail = worker.log_path.read_text(errors="replace")[-1500:]
                self.observed.unexpected_exits.append(f"worker-{i} rc={proc.returncode}: "
                                                      f"{tail}")
                worker.proc = None
                worker.start()
                continue
            try:
                peak = worker.memory_kib().get("VmHWM", 0) / 1024
            except OSError:
                continue
            self.observed.peak_rss_mib = max(self.observed.peak_rss_mib, peak)

    def stop(self) -> None:
        for worker in self.workers:
            worker.stop()


async def chaos(c: Campaign, fleet: Fleet, rng: random.Random, until: float) -> None:
    """Kill workers at random moments until ``c.kills`` kills are done or ``until``."""
    gaps = [rng.expovariate(1.0) for _ in range(c.kills)]
    scale = 0.9 * c.duration_s / max(sum(gaps), 1e-9)
    for gap in gaps:
        await asyncio.sleep(gap * scale)
        if time.monotonic() > until or fleet.observed.kills >= c.kills:
            return
        # One worker is the usual victim (its partitions move to the other and back).
        index = 0 if len(fleet.workers) == 1 or rng.random() < 0.75 else 1
        fleet.kill(index)
        await asyncio.sleep(rng.uniform(0.2, 3.0))
        fleet.workers[index].start()
        if rng.random() < 0.3 and fleet.observed.kills < c.kills:
            await asyncio.sleep(rng.uniform(0.3, 5.0))  # during start-up or table recovery
            fleet.kill(index)
            fleet.observed.startup_kills += 1
            await asyncio.sleep(rng.uniform(0.2, 2.0))
            fleet.workers[index].start()


async def _producer(settings: Settings) -> AIOKafkaProducer:
    producer = AIOKafkaProducer(bootstrap_servers=settings.bootstrap_servers, acks="all",
                                enable_idempotence=True, linger_ms=5,
                                max_request_size=2 << 20, request_timeout_ms=60_000)
    await producer.start()
    return producer


async def produce(c: Campaign, settings: Settings, sends: list[Send], broker: BrokerProcess,
                  observed: Observed) -> None:
    """Send the plan on time; restart the broker at evenly spaced moments (Kafka only)."""
    restarts = ([c.duration_s * (k + 1) / (c.broker_restarts + 1)
                 for k in range(c.broker_restarts)] if c.broker == "kafka" else [])
    producer = await _producer(settings)
    started = time.monotonic()
    futures: list[asyncio.Future[Any]] = []
    try:
        for send in sends:
            if restarts and send.at >= restarts[0]:
                restarts.pop(0)
                await producer.stop()  # flushes: every record so far is on the broker
                await asyncio.gather(*futures)
                futures.clear()
                await asyncio.to_thread(_restart, broker)
                observed.broker_restarts += 1
                producer = await _producer(settings)
            delay = started + send.at - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            futures.append(await producer.send(send.topic, send.value, key=send.key))
            observed.sent += 1
            if len(futures) >= 2000:
                await asyncio.gather(*futures)
                futures.clear()
        await producer.flush()
        await asyncio.gather(*futures)
    finally:
        await producer.stop()


def _restart(broker: BrokerProcess) -> None:
    broker.stop()
    time.sleep(1.0)
    broker.start()


async def read_topic(settings: Settings, topic: str) -> list[Any]:
    """Every record of a topic up to its end now (a fresh consumer, no group)."""
    consumer = AIOKafkaConsumer(bootstrap_servers=settings.bootstrap_servers,
                                enable_auto_commit=False, auto_offset_reset="earliest")
    await consumer.start()
    try:
        tps = await topic_partitions(consumer, topic)
        if not tps:
            return []
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends = await consumer.end_offsets(tps)
        out: list[Any] = []
        while [tp for tp in tps if await consumer.position(tp) < ends[tp]]:
            for records in (await consumer.getmany(timeout_ms=1000)).values():
                out.extend(records)
        return out
    finally:
        await consumer.stop()


async def decided_jobs(settings: Settings) -> set[str]:
    return {r.key.decode() for r in await read_topic(settings, settings.topic("decisions"))}


def check(truth: Truth, decisions: list[Any], letters: list[Any],
          observed: Observed) -> dict[str, Any]:
    """The campaign's findings; ``passed`` when every count that must be 0 is."""
    by_job: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for record in decisions:
        value = orjson.loads(record.value)
        by_job[value["job_id"]].append(value)
    verdicts = {job: {(d["verdict"], d["category"]) for d in ds} for job, ds in by_job.items()}
    wrong_count = [(job, d["line_count"], truth.lines.get(job)) for job, ds in by_job.items()
                   for d in ds if job in truth.lines and d["line_count"] != truth.lines[job]]
    keys = Counter()
    coordinates = Counter()
    for record in letters:
        letter = orjson.loads(record.value)
        coordinates[(letter["topic"], letter["partition"], letter["offset"])] += 1
        if record.key is not None and record.key.startswith(b"fuzz-"):
            keys[record.key] += 1
    findings = {
        "lost_decisions": sorted(truth.failed - set(by_job)),
        "conflicting_verdicts": sorted(j for j, v in verdicts.items() if len(v) > 1),
        "short_windows": [w for w in wrong_count if w[1] < (w[2] or 0)],
        "long_windows": [w for w in wrong_count if w[1] > (w[2] or 0)],
        "decided_completed": sorted(truth.completed & set(by_job)),
        "bad_records_unaccounted": len(truth.bad_keys - set(keys)),
        "valid_records_dead_lettered": len(truth.good_fuzz_keys & set(keys)),
        "unexpected_exits": observed.unexpected_exits,
    }
    summary = {
        "failed_attempts": len(truth.failed), "completed_attempts": len(truth.completed),
        "decisions": len(decisions),
        "duplicate_decisions": len(decisions) - len(by_job),
        "bad_records_sent": len(truth.bad_keys), "valid_fuzz_records": len(truth.good_fuzz_keys),
        "dead_letters": len(letters),
        "duplicate_dead_letters": sum(n - 1 for n in coordinates.values()),
        **{k: v for k, v in asdict(observed).items() if k != "unexpected_exits"},
        # Where to start looking when bad records are unaccounted for: their keys.
        "unaccounted_keys": sorted(k.decode(errors="replace")
                                   for k in truth.bad_keys - set(keys))[:20],
    }
    passed = all(not v for v in findings.values())
    return {"passed": passed, "findings": findings, "summary": summary}


async def run(c: Campaign, workdir: Path, log: Callable[[str], None]) -> dict[str, Any]:
    """One campaign in ``workdir``; the report."""
    broker = (apache_kafka if c.broker == "kafka" else tansu)(workdir / "broker")
    observed = Observed()
    await asyncio.to_thread(broker.start)  # it waits for the broker with asyncio.run
    try:
        prefix = f"chaos{c.seed}."
        settings = Settings.from_env(
            {}, bootstrap_servers=broker.bootstrap_servers, topic_prefix=prefix,
            group_id=prefix + "workers", partitions=str(c.partitions), store="rocksdb",
            grace_period_s="1.0", max_line_bytes=str(c.max_line_bytes), log_level="warning")
        await ensure_topics(settings)
        sends, truth = plan(c, settings)
        log(f"plan: {len(truth.failed)} failed and {len(truth.completed)} completed jobs, "
            f"{len(sends)} records ({len(truth.bad_keys)} bad), {c.kills} kills, "
            f"{c.broker_restarts if c.broker == 'kafka' else 0} broker restarts")
        fleet = Fleet(settings, workdir, 2, observed)
        fleet.start()
        rng = random.Random(c.seed + 1)
        started = time.monotonic()

        async def watch(until: Callable[[], bool]) -> None:
            while not until():
                fleet.watch()
                await asyncio.sleep(0.5)

        done = False
        watcher = asyncio.create_task(watch(lambda: done))
        try:
            await asyncio.gather(produce(c, settings, sends, broker, observed),
                                 chaos(c, fleet, rng, started + c.duration_s))
            log(f"produced {observed.sent} records, {observed.kills} kills "
                f"({observed.startup_kills} in start-up), {observed.broker_restarts} broker "
                f"restarts in {time.monotonic() - started:.0f} s; settling")
            # Settled: every failed job decided and every input record taken (the group's
            # committed offsets at the ends: a record is committed only once handled). Until
            # then a missing dead letter may only be late, not lost.
            deadline = time.monotonic() + c.settle_s
            lag = LagProbe(settings, [settings.topic("logs"), settings.topic("job-events")])
            try:
                while time.monotonic() < deadline:
                    lags = await lag.lag()
                    if (truth.failed <= await decided_jobs(settings) and lags
                            and not any(lags.values())):
                        break
                    await asyncio.sleep(3.0)
            finally:
                await lag.close()
            await asyncio.sleep(5.0)  # late duplicates and dead letters
            decisions = await read_topic(settings, settings.topic("decisions"))
            letters = await read_topic(settings, settings.topic("deadletter"))
        finally:
            done = True
            await watcher
            fleet.stop()
    finally:
        broker.stop()
    report = check(truth, decisions, letters, observed)
    report["campaign"] = asdict(c)
    report["wall_s"] = round(time.monotonic() - started, 1)
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--broker", choices=("kafka", "tansu"), default="kafka")
    parser.add_argument("--quick", action="store_true", help="the short campaign CI runs")
    for name in ("jobs", "kills", "broker_restarts", "fuzz", "seed"):
        parser.add_argument(f"--{name.replace('_', '-')}", type=int)
    for name in ("duration_s", "settle_s"):
        parser.add_argument(f"--{name.replace('_', '-')}", type=float)
    parser.add_argument("--json", type=Path, help="write the report here")
    parser.add_argument("--workdir", type=Path, help="keep brokers' and workers' files here")
    args = parser.parse_args(argv)
    base = QUICK if args.quick else Campaign()
    overrides = {k: v for k, v in vars(args).items()
                 if k in Campaign.__dataclass_fields__ and v is not None}
    c = replace(base, **overrides)

    def log(message: str) -> None:
        print(f"[chaos] {message}", file=sys.stderr, flush=True)

    if args.workdir is not None:
        args.workdir.mkdir(parents=True, exist_ok=True)
        report = asyncio.run(run(c, args.workdir, log))
    else:
        with tempfile.TemporaryDirectory(prefix="sibylla-chaos-") as tmp:
            report = asyncio.run(run(c, Path(tmp), log))
    text = json.dumps(report, indent=2, default=str)
    if args.json is not None:
        args.json.write_text(text + "\n")
    summary, findings = report["summary"], report["findings"]
    print(json.dumps({"passed": report["passed"], **summary,
                      **{k: len(v) if isinstance(v, list) else v
                         for k, v in findings.items()}}, indent=2))
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
