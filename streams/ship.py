"""Publishing job output and job events the way a log shipper and a scheduler hook do.

Used by ``sibylla ship``, the demo, the benchmark and the tests: the one producer of the
contract in this repository. Lines go out as LogBatch records (many lines of one attempt per
record: the fast path), the last one marked end-of-stream so the worker need not wait out the
grace period.

Every record's delivery is checked: aiokafka's ``flush`` waits for the broker but reports no
failure, so a refused batch of lines would go unnoticed while the job's termination, sent
after it, arrives, and the worker would decide on a log it never got. :meth:`Shipper.flush`
raises instead, and callers (the Slurm epilog) then move no cursor and exit non-zero.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Sequence
from typing import Any

import orjson
from aiokafka import AIOKafkaProducer

from sibylla.schemas.records import JobEvent
from sibylla.settings import Settings

__all__ = ["DeliveryError", "Shipper", "ship_file"]


# A LogBatch record's largest value: Kafka refuses a record batch over its message.max.bytes
# (1 MiB by default), whatever the producer allows; a line is at most 16 KiB (the contract).
RECORD_MAX_BYTES = 512 << 10
_EOS_TAIL = b'],"eos":true}'


def _parts(entries: list[bytes], max_lines: int, max_bytes: int) -> list[list[bytes]]:
    """``entries`` cut into runs of at most ``max_lines`` entries and ``max_bytes`` bytes
    (with their separators); an entry over ``max_bytes`` goes alone. At least one run."""
    parts: list[list[bytes]] = [[]]
    size = 0
    for entry in entries:
        part = parts[-1]
        if part and (len(part) >= max_lines or size + 1 + len(entry) > max_bytes):
            part = []
            parts.append(part)
            size = 0
        part.append(entry)
        size += len(entry) + 1
    return parts


class DeliveryError(RuntimeError):
    """Records the broker did not take (after the producer's own retries)."""


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
        # Deliveries not yet answered, and the failures among those answered since the last
        # flush (a set, not a list of every send: a long ship keeps only what is in flight).
        self._in_flight: set[asyncio.Future[Any]] = set()
        self._failed: list[BaseException] = []

    async def __aenter__(self) -> Shipper:
        await self._producer.start()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, *_: object) -> None:
        try:
            if exc_type is None:
                await self.flush()  # leaving normally: what was sent must have arrived
        finally:
            await self._producer.stop()

    async def _send(self, topic: str, value: bytes | None, key: bytes | None) -> None:
        delivery = await self._producer.send(topic, value, key=key)
        self._in_flight.add(delivery)
        delivery.add_done_callback(self._answered)

    def _answered(self, delivery: asyncio.Future[Any]) -> None:
        self._in_flight.discard(delivery)
        if not delivery.cancelled() and (exc := delivery.exception()) is not None:
            self._failed.append(exc)

    async def send_raw(self, topic: str, key: bytes | None, value: bytes | None) -> None:
        await self._send(topic, value, key)

    async def send_lines(self, job_id: str, lines: Sequence[str], attempt: int = 0,
                         eos: bool = False, batch_lines: int = 500, stream: str = "stdout",
                         host: str | None = None) -> None:
        """Lines of one attempt as LogBatch records of at most ``batch_lines`` lines and
        :data:`RECORD_MAX_BYTES` bytes (the last marked ``eos`` when asked; no lines and
        ``eos`` is a bare end-of-stream mark)."""
        key = job_id.encode()
        now = time.time()
        extra = {"host": host} if host else {}
        head = orjson.dumps({"job_id": job_id, "attempt": attempt})[:-1] + b',"lines":['
        entries = [orjson.dumps({"ts": now, "stream": stream, "line": ln, **extra})
                   for ln in lines]
        parts = _parts(entries, batch_lines, RECORD_MAX_BYTES - len(head) - len(_EOS_TAIL))
        for i, part in enumerate(parts):
            tail = _EOS_TAIL if eos and i == len(parts) - 1 else b"]}"
            await self._send(self.logs_topic, head + b",".join(part) + tail, key)

    async def send_event(self, event: JobEvent) -> None:
        record = event.to_dict()
        if record["ts"] is None:
            record["ts"] = time.time()
        await self._send(self.events_topic, orjson.dumps(record), event.job_id.encode())

    async def flush(self) -> None:
        """Wait until the broker has answered every record sent so far; :class:`DeliveryError`
        if it refused any (the producer's retries spent)."""
        await self._producer.flush()
        await asyncio.gather(*self._in_flight, return_exceptions=True)
        failed, self._failed = self._failed, []
        if failed:
            raise DeliveryError(f"{len(failed)} record(s) not delivered: {failed[0]!r}"
                                ) from failed[0]


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
            await shipper.flush()  # the termination only once the broker holds the log
            nodes = tuple(n for n in args.nodes.split(",") if n)
            await shipper.send_event(JobEvent(args.job_id, args.attempt, "finished", args.state,
                                              args.exit_code, None, nodes))
        await shipper.flush()
    print(f"shipped {len(lines)} lines of {args.job_id} attempt {args.attempt}", file=sys.stderr)
    return 0
