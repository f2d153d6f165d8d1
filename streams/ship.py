"""Publishing job output and job events the way a log shipper and a scheduler hook do.

Used by ``sibylla ship``, the demo, the benchmark and the tests: the one producer of the
contract in this repository. Lines go out as LogBatch records (many lines of one attempt per
record: the fast path), the last one marked end-of-stream so the worker need not wait out the
grace period.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from typing import Any

import orjson
from aiokafka import AIOKafkaProducer

from sibylla.schemas.records import JobEvent
from sibylla.settings import Settings

__all__ = ["Shipper", "ship_file"]


class Shipper:
    """An aiokafka producer of LogBatch, LogLine and JobEvent records."""

    def __init__(self, settings: Settings, **producer_options: Any) -> None:
        self.settings = settings
        self.logs_topic = settings.topic("logs")
        self.events_topic = settings.topic("job-events")
        options: dict[str, Any] = {"linger_ms": 5, "max_batch_size": 1 << 20,
                                   "max_request_size": 4 << 20}
        options.update(producer_options)
        self._producer = AIOKafkaProducer(bootstrap_servers=settings.bootstrap_servers,
                                          **settings.kafka_client_options(), **options)

    async def __aenter__(self) -> Shipper:
        await self._producer.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._producer.stop()

    async def send_raw(self, topic: str, key: bytes | None, value: bytes | None) -> None:
        await self._producer.send(topic, value, key=key)

    async def send_lines(self, job_id: str, lines: Sequence[str], attempt: int = 0,
                         eos: bool = False, batch_lines: int = 500, stream: str = "stdout",
                         host: str | None = None) -> None:
        """Lines of one attempt as LogBatch records of at most ``batch_lines`` lines."""
        key = job_id.encode()
        now = time.time()
        extra = {"host": host} if host else {}
        starts = range(0, max(len(lines), 1), batch_lines)
        for i, start in enumerate(starts):
            part = lines[start:start + batch_lines]
            record: dict[str, Any] = {
                "job_id": job_id, "attempt": attempt,
                "lines": [{"ts": now, "stream": stream, "line": ln, **extra} for ln in part],
            }
            if eos and i == len(starts) - 1:
                record["eos"] = True
            await self._producer.send(self.logs_topic, orjson.dumps(record), key=key)

    async def send_event(self, event: JobEvent) -> None:
        record = event.to_dict()
        if record["ts"] is None:
            record["ts"] = time.time()
        await self._producer.send(self.events_topic, orjson.dumps(record),
                                  key=event.job_id.encode())

    async def flush(self) -> None:
        await self._producer.flush()


async def ship_file(settings: Settings, args: argparse.Namespace) -> int:
    """``sibylla ship``: one job's log file, then optionally its termination event."""
    source = sys.stdin if args.file == "-" else open(args.file, encoding="utf-8",  # noqa: SIM115
                                                     errors="replace")
    with source:
        lines = [line.rstrip("\n") for line in source]
    async with Shipper(settings) as shipper:
        await shipper.send_lines(args.job_id, lines, args.attempt, eos=True,
                                 batch_lines=args.batch_lines)
        if args.state:
            nodes = tuple(n for n in args.nodes.split(",") if n)
            await shipper.send_event(JobEvent(args.job_id, args.attempt, "finished", args.state,
                                              args.exit_code, None, nodes))
        await shipper.flush()
    print(f"shipped {len(lines)} lines of {args.job_id} attempt {args.attempt}", file=sys.stderr)
    return 0
