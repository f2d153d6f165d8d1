"""Helpers of the pipeline benchmark: synthetic training logs, producing, a worker process.

Kept apart from ``bench_pipeline.py`` so the measurement script reads as the method it
implements (produce, consume, time) rather than as process and protocol plumbing.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import re
import signal
import subprocess
import sys
import time
import urllib.request
import zlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from sibylla.brokers.process import die_with_parent, free_port, stop_process_group
from sibylla.settings import Settings
from sibylla.streams.keys import partition_of

__all__ = [
    "LinePool",
    "Worker",
    "bare_consume",
    "batch_record",
    "line_record",
    "produce_partitioned",
    "topic_partitions",
    "topic_records",
]

# ----------------------------------------------------------------------------- synthetic logs

_WARNINGS = (
    "UserWarning: torch.utils.checkpoint: the use_reentrant parameter should be passed "
    "explicitly.",
    "[W reducer.cpp:1300] Warning: find_unused_parameters=True was specified in DDP "
    "constructor, but did not find any unused parameters in the forward pass.",
    "WARNING:root:gradient overflow, skipping step, loss scaler 0 reducing loss scale to 32768.0",
    "FutureWarning: `torch.cuda.amp.GradScaler(args...)` is deprecated. Please use "
    "`torch.amp.GradScaler('cuda', args...)` instead.",
    "NCCL INFO Channel 02/32 : 0[0] -> 1[1] via P2P/CUMEM/read",
)


class TrainingLog:
    """Lines a data-parallel training job prints: step/loss/lr/throughput lines under a rank
    prefix, tqdm progress bars, checkpoints, evaluation and the odd warning.

    Realistic text matters: the ingest path runs an error-start regex and a byte count on
    every line, whose cost depends on length and content. Seeded per job, so every run
    produces the same bytes.
    """

    def __init__(self, job: int, ranks: int = 8) -> None:
        self.rng = random.Random(job)
        self.ranks = ranks
        self.step = 0
        self.loss = 4.0 + self.rng.random()

    def lines(self, n: int) -> list[str]:
        """The next ``n`` lines of this job's output."""
        rng, out = self.rng, []
        for _ in range(n):
            self.step += 1
            self.loss *= 0.9995
            rank = rng.randrange(self.ranks)
            kind = rng.random()
            if kind < 0.70:
                out.append(
                    f"[rank{rank}]: step {self.step} | loss {self.loss + rng.gauss(0, 0.05):.4f}"
                    f" | lr {3e-4 * min(1.0, self.step / 2000):.3e} | grad_norm "
                    f"{rng.uniform(0.2, 1.5):.3f} | {rng.uniform(95, 160):.1f} samples/s | "
                    f"mem {rng.uniform(30, 70):.1f}GB")
            elif kind < 0.90:
                done = self.step % 1000
                bar = "#" * (done // 100)
                out.append(f"Epoch {self.step // 1000}: {done / 10:3.0f}%|{bar:<10}| "
                           f"{done}/1000 [{done // 60:02d}:{done % 60:02d}<07:12, "
                           f"{rng.uniform(2, 3):.2f}it/s, loss={self.loss:.3f}]")
            elif kind < 0.96:
                out.append(f"[rank{rank}]: {rng.choice(_WARNINGS)}")
            elif kind < 0.99:
                out.append(f"INFO:trainer:eval step {self.step}: val_loss={self.loss * 1.05:.4f}"
                           f" val_ppl={2.718 ** min(self.loss, 20):.2f} tokens={self.step * 4096}")
            else:
                out.append(f"INFO:checkpoint:saved checkpoint to /ckpt/run/step_{self.step}.pt "
                           f"({rng.uniform(1, 9):.2f} GB in {rng.uniform(3, 30):.1f}s)")
        return out


class LinePool:
    """Each job's output cut from one pool of generated lines, every job at its own offset.

    Generating a line costs about 6 µs, as much as the worker may spend on it; a pool keeps
    the producer out of the way while every job still prints realistic, varied lines.
    """

    def __init__(self, size: int = 60_000) -> None:
        self.pool = TrainingLog(0).lines(size)
        self.cursors: dict[str, int] = {}

    def take(self, job_id: str, n: int) -> list[str]:
        """The next ``n`` lines of ``job_id``."""
        pool, size = self.pool, len(self.pool)
        start = self.cursors.get(job_id, zlib.crc32(job_id.encode()) % size)
        self.cursors[job_id] = (start + n) % size
        if start + n <= size:
            return pool[start:start + n]
        return [pool[(start + i) % size] for i in range(n)]


def batch_record(job_id: str, lines: Sequence[str], eos: bool = False) -> bytes:
    """A LogBatch record, as ``Shipper.send_lines`` encodes it."""
    now = time.time()
    record: dict[str, Any] = {"job_id": job_id, "attempt": 0,
                              "lines": [{"ts": now, "stream": "stdout", "line": ln}
                                        for ln in lines]}
    if eos:
        record["eos"] = True
    return orjson.dumps(record)


def line_record(job_id: str, line: str) -> bytes:
    """A LogLine record, as ``Shipper.send_line`` encodes it."""
    return orjson.dumps({"job_id": job_id, "attempt": 0, "ts": time.time(),
                         "stream": "stdout", "line": line})


# ----------------------------------------------------------------------------- Kafka clients

async def produce_partitioned(settings: Settings, topic: str,
                              records: Iterator[tuple[str, bytes]]) -> tuple[int, float]:
    """Publish ``(job_id, value)`` pairs keyed by job_id; returns (messages, seconds).

    Uses aiokafka's batch API with the partition the worker expects (murmur2 of the job_id),
    which produces several times faster than one ``send`` per record; the benchmark wants
    the broker filled quickly, not the producer measured.
    """
    producer = AIOKafkaProducer(bootstrap_servers=settings.bootstrap_servers,
                                max_request_size=8 << 20, linger_ms=5,
                                **settings.kafka_client_options())
    await producer.start()
    started = time.perf_counter()
    count = 0
    builders: dict[int, Any] = {}
    pending: list[asyncio.Future[Any]] = []

    async def ship(partition: int) -> None:
        builder = builders.pop(partition)
        pending.append(await producer.send_batch(builder, topic, partition=partition))
        if len(pending) > 64:
            await asyncio.gather(*pending)
            pending.clear()

    try:
        for job_id, value in records:
            key = job_id.encode()
            partition = partition_of(job_id, settings.partitions)
            builder = builders.get(partition)
            if builder is None:
                builder = builders[partition] = producer.create_batch()
            if builder.append(key=key, value=value, timestamp=None) is None:
                await ship(partition)
                builder = builders[partition] = producer.create_batch()
                if builder.append(key=key, value=value, timestamp=None) is None:
                    raise ValueError(f"a record of {len(value)} bytes does not fit a batch")
            count += 1
        for partition in list(builders):
            await ship(partition)
        await asyncio.gather(*pending)
    finally:
        await producer.stop()
    return count, time.perf_counter() - started


async def bare_consume(settings: Settings, topic: str, expected_lines: int,
                       timeout_s: float) -> dict[str, float]:
    """The reference consumer: aiokafka ``getmany`` plus ``orjson.loads`` of every record,
    counting lines (a LogBatch's list, or one per LogLine), no group, from the beginning.

    Timed like the worker: from the first fetched batch to the last line, so connecting and
    the first fetch round trip are excluded on both sides of the ratio.
    """
    consumer = AIOKafkaConsumer(bootstrap_servers=settings.bootstrap_servers,
                                enable_auto_commit=False, auto_offset_reset="earliest",
                                **settings.kafka_client_options())
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(settings.partitions)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        deadline = time.monotonic() + timeout_s
        first_t = first_n = None
        first_cpu = 0.0
        lines = 0
        loads = orjson.loads
        while lines < expected_lines and time.monotonic() < deadline:
            batch = await consumer.getmany(timeout_ms=1000)
            for records in batch.values():
                for record in records:
                    value = loads(record.value)
                    batch_lines = value.get("lines")
                    lines += 1 if batch_lines is None else len(batch_lines)
            if first_t is None and lines:
                first_t, first_n, first_cpu = time.perf_counter(), lines, time.process_time()
        end, cpu = time.perf_counter(), time.process_time()
    finally:
        await consumer.stop()
    if first_t is None or first_n is None or lines < expected_lines:
        raise RuntimeError(f"bare consumer read {lines} of {expected_lines} lines")
    # This process does nothing else meanwhile, so its CPU time is the loop's.
    return {"lines": lines, "seconds": end - first_t,
            "lines_per_s": (lines - first_n) / max(end - first_t, 1e-9),
            "cpu_s": cpu - first_cpu, "cpu_share": (cpu - first_cpu) / max(end - first_t, 1e-9),
            "cpu_us_per_line": (cpu - first_cpu) / max(lines - first_n, 1) * 1e6}


async def topic_partitions(consumer: AIOKafkaConsumer, topic: str) -> list[TopicPartition]:
    """The partitions of ``topic`` (metadata refreshed once if the consumer does not know it
    yet: a topic created after the consumer started)."""
    partitions = consumer.partitions_for_topic(topic)
    if not partitions:
        await consumer._client.force_metadata_update()
        partitions = consumer.partitions_for_topic(topic) or set()
    return [TopicPartition(topic, p) for p in sorted(partitions)]


async def topic_records(settings: Settings, topic: str) -> int:
    """Records a topic holds (sum of its partitions' end offsets; nothing is compacted or
    deleted during a benchmark)."""
    consumer = AIOKafkaConsumer(bootstrap_servers=settings.bootstrap_servers,
                                enable_auto_commit=False, **settings.kafka_client_options())
    await consumer.start()
    try:
        ends = await consumer.end_offsets(await topic_partitions(consumer, topic))
        return sum(ends.values())
    finally:
        await consumer.stop()


# ----------------------------------------------------------------------------- the worker

_METRIC = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? ([-+0-9.eEinfNa]+)$")


def process_tree(root: int) -> dict[int, list[str]]:
    """The /proc stat fields (after the command name) of process ``root`` and its
    descendants, by PID."""
    stats: dict[int, list[str]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:  # ended meanwhile
                continue
            stats[int(entry.name)] = stat[stat.rindex(")") + 2:].split()
    children: dict[int, list[int]] = {}
    for pid, fields in stats.items():
        children.setdefault(int(fields[1]), []).append(pid)
    tree, todo = {}, [root]
    while todo:
        pid = todo.pop()
        if pid in stats:
            tree[pid] = stats[pid]
            todo += children.get(pid, [])
    return tree


def _cpu_s(fields: list[str]) -> float:
    """User + system CPU seconds of one process, from its /proc stat fields."""
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def tree_cpu_s(root: int | None) -> float:
    """CPU seconds process ``root`` and its descendants have used so far (0 when None)."""
    return 0.0 if root is None else sum(map(_cpu_s, process_tree(root).values()))


def box_cpu_ticks() -> tuple[int, int]:
    """(busy, total) CPU ticks of the whole machine so far, every core (/proc/stat): what
    the worker, the broker, the load generator and anything else took together."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return sum(fields) - idle, sum(fields)


class Worker:
    """``python -m sibylla worker`` as a child process with its own settings, a context manager.

    Its own session (process group), so stopping it never touches the benchmark, and the
    pid is the Python process itself, whose /proc status gives the peak RSS.
    """

    def __init__(self, env: dict[str, str], log_path: Path,
                 command: Sequence[str] = (sys.executable, "-m", "sibylla", "worker")) -> None:
        self.web_port = free_port()
        self.env = {**os.environ, **env, "SIBYLLA_WEB_PORT": str(self.web_port)}
        self.log_path = log_path
        self.command = list(command)
        self.proc: subprocess.Popen[bytes] | None = None
        self.spawned_at = 0.0  # time.time() at spawn, comparable with Kafka timestamps

    def start(self) -> Worker:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as out:
            self.spawned_at = time.time()
            self.proc = subprocess.Popen(self.command, stdout=out, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, env=self.env,
                                         start_new_session=True, preexec_fn=die_with_parent)
        return self

    def check_alive(self) -> None:
        """Raise with the end of the worker's log when it died."""
        if self.proc is not None and self.proc.poll() is not None:
            tail = self.log_path.read_text(errors="replace")[-3000:]
            raise RuntimeError(f"worker exited with {self.proc.returncode}:\n{tail}")

    def metrics(self, by_label: bool = False) -> dict[str, float]:
        """Samples of /metrics, labelled series summed per name (``by_label``: each series
        apart, under its name and labels); empty while not serving."""
        try:
            with urllib.request.urlopen(
                    f"http://127.0.0.1:{self.web_port}/metrics", timeout=2) as response:
                text = response.read().decode()
        except OSError:
            return {}
        out: dict[str, float] = {}
        for line in text.splitlines():
            match = _METRIC.match(line)
            if match:
                name = match[1] + (match[2] or "") if by_label else match[1]
                out[name] = out.get(name, 0.0) + float(match[3])
        return out

    def _tree_stats(self) -> dict[int, list[str]]:
        """The /proc stat fields of the worker and its descendants (the model and the window
        reader run in child processes: ``inference/remote.py``, ``streams/reading.py``)."""
        assert self.proc is not None
        return process_tree(self.proc.pid)

    def cpu_s(self) -> float:
        """CPU seconds (user + system, all threads) the worker and its child processes have
        used so far."""
        return sum(self.cpu_s_by_process().values())

    def cpu_s_by_process(self) -> dict[str, float]:
        """:meth:`cpu_s` split between the worker's own process (its event loop and threads)
        and the processes it started for the model and the window reader."""
        out = {"worker": 0.0, "model and reader": 0.0}
        for pid, fields in self._tree_stats().items():
            try:
                command = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:  # ended meanwhile
                continue
            role = "model and reader" if b"multiprocessing" in command else "worker"
            out[role] += _cpu_s(fields)
        return out

    def memory_kib(self) -> dict[str, int]:
        """VmHWM and VmRSS in KiB, summed over the worker and its child processes: VmRSS is
        what they hold now, VmHWM the sum of each one's peak (at least the tree's peak)."""
        out = {"VmHWM": 0, "VmRSS": 0}
        for pid in self._tree_stats():
            try:
                status = Path(f"/proc/{pid}/status").read_text()
            except OSError:
                continue
            for line in status.splitlines():
                name, _, value = line.partition(":")
                if name in out:
                    out[name] += int(value.split()[0])
        return out

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """The worker's own process stopped (SIGSTOP) for the block, then continued: records
        produced meanwhile wait for it as a backlog. Keep the block shorter than the session
        timeout (6 s), or the group moves its partitions."""
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGSTOP)
        try:
            yield
        finally:
            os.kill(self.proc.pid, signal.SIGCONT)

    def kill(self) -> None:
        """SIGKILL the worker's process group: a crash, no shutdown, no final commit."""
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None:
            stop_process_group(proc, 15.0)

    def __enter__(self) -> Worker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
