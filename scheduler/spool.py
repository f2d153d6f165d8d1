"""Attempts the epilog could not publish because the broker was away, kept on local disk until
a later epilog run publishes them.

The epilog runs once per attempt and must end within its bound, so it cannot wait out a broker
restart. Without a spool, a failure that ended during one was never decided: its event and its
log were gone, and the scheduler's actuator never heard of it. Each entry is one attempt's
shipment (its new output lines by stream, then its event; only the event once the broker
holds the lines), written atomically; every later epilog run publishes its own attempt first,
then what the spool holds, oldest first, within what is left of its bound.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import orjson

from sibylla.schemas.records import JobEvent, RecordError, parse_job_event

__all__ = ["Shipment", "Spool", "file_safe"]

log = logging.getLogger(__name__)


def file_safe(job_id: str) -> str:
    """``job_id`` as a part of a file name in the epilog's state directory (its cursors and
    its spool): anything but letters, digits, ``.`` and ``-`` becomes ``_``."""
    return re.sub(r"[^\w.-]", "_", job_id)


@dataclass(frozen=True)
class Shipment:
    """What the epilog publishes for one attempt: its output's new lines by stream (the last
    part marked end-of-stream), then its event."""

    event: JobEvent
    parts: tuple[tuple[str, tuple[str, ...]], ...]

    def to_json(self) -> bytes:
        return orjson.dumps({"event": self.event.to_dict(),
                             "parts": [[stream, list(lines)] for stream, lines in self.parts]})

    @classmethod
    def from_json(cls, data: bytes) -> Shipment:
        """:class:`RecordError` when ``data`` is not a shipment."""
        try:
            raw = orjson.loads(data)
            event = parse_job_event(orjson.dumps(raw["event"]))
            parts = tuple((str(stream), tuple(map(str, lines))) for stream, lines in raw["parts"])
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise RecordError(f"not a spooled shipment: {exc}", "malformed") from exc
        return cls(event, parts)

    def without_lines(self) -> Shipment:
        """This shipment once the broker holds its lines: only the event is left to publish
        (sending the lines again would put them twice into the job's window)."""
        return Shipment(self.event, ())


class Spool:
    """A directory of shipments, one file each, named so that listing sorts them oldest first."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def put(self, shipment: Shipment) -> Path:
        """Keep ``shipment``; its file."""
        self.directory.mkdir(parents=True, exist_ok=True)
        event = shipment.event
        path = self.directory / (f"{time.time_ns():020d}-{os.getpid()}-"
                                 f"{file_safe(event.job_id)}.{event.attempt}.json")
        self.rewrite(path, shipment)
        return path

    def rewrite(self, path: Path, shipment: Shipment) -> None:
        """Keep ``shipment`` in ``path`` (atomically), in its place in the order."""
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(shipment.to_json())
        tmp.replace(path)

    @contextlib.contextmanager
    def draining(self) -> Iterator[bool]:
        """Whether this process may publish the spool now: slurmctld runs epilogs of several
        jobs at once, and two draining it together would publish its attempts twice. The
        one that finds it taken leaves it to the other (a lock held until the block ends)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        with open(self.directory / ".lock", "w") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                yield False
                return
            yield True

    def paths(self) -> list[Path]:
        """The kept shipments' files, oldest first."""
        if not self.directory.is_dir():
            return []
        return sorted(self.directory.glob("*.json"))

    def load(self, path: Path) -> Shipment | None:
        """The shipment in ``path``; None for a file that holds none (set aside)."""
        try:
            return Shipment.from_json(path.read_bytes())
        except RecordError as exc:
            self.set_aside(path, exc)
            return None

    def set_aside(self, path: Path, why: BaseException) -> None:
        """Keep the entry in ``path`` out of the way as ``.bad`` (for a human to look at),
        with a warning: it can never be published, and must not block the ones after it."""
        log.warning("spooled %s set aside: %s: %s", path.name, type(why).__name__, why)
        path.replace(path.with_suffix(".bad"))
