"""Python records of the topic contract, with validation fast enough for the ingest path.

The JSON Schema files beside this module are the contract for outside tools; these functions
enforce the same rules by hand because ``jsonschema`` costs tens of microseconds per record and
the log topic carries hundreds of thousands of lines a second. A test checks that both agree.
Every parser raises :class:`RecordError` with a reason a human can act on; the agents route such
records to the dead-letter topic.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Literal, TypeVar

import orjson

__all__ = [
    "SCHEMA_VERSION",
    "FAILED_STATES",
    "Decision",
    "DeadLetter",
    "FieldMap",
    "JobEvent",
    "Label",
    "LogChunk",
    "ModelAnnouncement",
    "RecordError",
    "Vote",
    "job_key",
    "load_json_object",
    "parse_job_event",
    "parse_log_record",
]

SCHEMA_VERSION = 1
MAX_JOB_ID = 256

Verdict = Literal["deterministic", "nondeterministic", "unknown"]
Action = Literal["do_not_retry", "retry", "retry_elsewhere", "default_policy"]

JOB_STATES = frozenset(
    {"COMPLETED", "FAILED", "NODE_FAIL", "TIMEOUT", "CANCELLED", "PREEMPTED", "OUT_OF_MEMORY"}
)
# States that make a finished attempt a failure Sibylla must judge. CANCELLED is a user's
# choice and PREEMPTED a scheduler's, not failures of the job; both release the window unless
# the exit code says otherwise.
FAILED_STATES = frozenset({"FAILED", "NODE_FAIL", "OUT_OF_MEMORY", "TIMEOUT"})
_STREAMS = ("stdout", "stderr")


class RecordError(ValueError):
    """A record breaks the contract; ``str(err)`` is the reason sent to the dead-letter topic."""


@dataclass(frozen=True, slots=True)
class FieldMap:
    """Where a shipper's native record keeps the contract's fields.

    Each value is a dotted path into the record (``kubernetes.labels.job-name``); it is only used
    when the contract's own field is absent, so native and contract records can share a topic.
    Built from a spec such as ``line=log,job_id=kubernetes.labels.job-name``.
    """

    paths: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    @classmethod
    def parse(cls, spec: str) -> FieldMap:
        paths: dict[str, tuple[str, ...]] = {}
        for item in filter(None, (p.strip() for p in spec.split(","))):
            name, sep, path = item.partition("=")
            if not sep or not name.strip() or not path.strip():
                raise ValueError(f"field map entry {item!r} is not NAME=dotted.path")
            paths[name.strip()] = tuple(path.strip().split("."))
        return cls(paths)

    def apply(self, record: dict[str, Any]) -> dict[str, Any]:
        for name, path in self.paths.items():
            if name in record:
                continue
            node: Any = record
            for part in path:
                if not isinstance(node, dict) or part not in node:
                    break
                node = node[part]
            else:
                record[name] = node
        return record


@dataclass(frozen=True, slots=True)
class LogChunk:
    """Lines of one job attempt from one Kafka record (a LogLine is a chunk of one line)."""

    job_id: str
    attempt: int
    lines: list[str]
    eos: bool = False


def _as_int(value: Any) -> int | None:
    """An integer as JSON Schema sees it (``2.0`` is one), else None. Booleans are not."""
    if type(value) is int:
        return value
    if type(value) is float and value.is_integer():
        return int(value)
    return None


R = TypeVar("R")


def from_known_fields(cls: type[R], raw: Mapping[str, Any]) -> R:
    """``cls`` from the fields it knows in ``raw``, ignoring the others.

    The contract lets records gain fields without a new ``schema_version`` (CONVENTIONS.md), so
    a reader must not fail on a field a newer writer added: an older ``sibylla decisions
    --follow`` or worker meets the new fields during every rolling upgrade. A missing required
    field still raises ``TypeError``.
    """
    known = {f.name for f in fields(cls)}  # type: ignore[arg-type]
    return cls(**{k: v for k, v in raw.items() if k in known})


def load_json_object(value: bytes) -> dict[str, Any]:
    """A record's JSON object; :class:`RecordError` when it is not one."""
    try:
        record = orjson.loads(value)
    except orjson.JSONDecodeError as exc:
        raise RecordError(f"invalid JSON or UTF-8: {exc}") from None
    if not isinstance(record, dict):
        raise RecordError("record is not a JSON object")
    return record


def job_key(record: dict[str, Any]) -> tuple[str, int]:
    """A record's validated (job_id, attempt); the attempt defaults to 0."""
    job_id = record.get("job_id")
    if not isinstance(job_id, str) or not job_id:
        raise RecordError("missing job_id (a non-empty string)")
    if len(job_id) > MAX_JOB_ID:
        raise RecordError(f"job_id longer than {MAX_JOB_ID} characters")
    attempt = _as_int(record.get("attempt", 0))
    if attempt is None or attempt < 0:
        raise RecordError("attempt must be an integer >= 0")
    return job_id, attempt


def _check_line(entry: Any, max_line_bytes: int, where: str) -> str:
    if not isinstance(entry, dict):
        raise RecordError(f"{where} is not an object")
    line = entry.get("line")
    if not isinstance(line, str):
        raise RecordError(f"{where}.line must be a string")
    # len() counts code points; UTF-8 needs at most 4 bytes each, so only long lines pay
    # for an exact byte count.
    if len(line) * 4 > max_line_bytes and len(line.encode()) > max_line_bytes:
        raise RecordError(f"{where}.line longer than {max_line_bytes} bytes")
    stream = entry.get("stream", "stdout")
    if stream not in _STREAMS:
        raise RecordError(f"{where}.stream must be stdout or stderr")
    return line


def parse_log_record(
    value: bytes, max_line_bytes: int, field_map: FieldMap | None = None
) -> LogChunk:
    """Parse one record of the logs topic, a LogLine or a LogBatch, into a :class:`LogChunk`."""
    record = load_json_object(value)
    if field_map is not None:
        field_map.apply(record)
    job_id, attempt = job_key(record)
    eos = record.get("eos", False)
    if type(eos) is not bool:
        raise RecordError("eos must be a boolean")
    if "lines" not in record:
        if "line" not in record and eos:
            return LogChunk(job_id, attempt, [], True)  # a bare end-of-stream marker
        return LogChunk(job_id, attempt, [_check_line(record, max_line_bytes, "record")], eos)
    batch = record["lines"]
    if not isinstance(batch, list):
        raise RecordError("lines must be a list")
    lines = [_check_line(e, max_line_bytes, f"lines[{i}]") for i, e in enumerate(batch)]
    return LogChunk(job_id, attempt, lines, eos)


@dataclass(frozen=True, slots=True)
class JobEvent:
    """A job attempt started or finished (the scheduler's view)."""

    job_id: str
    attempt: int
    event: Literal["started", "finished"]
    state: str | None = None
    exit_code: int | None = None
    signal: int | str | None = None
    nodes: tuple[str, ...] = ()
    gpus: int = 0
    ts: float | str | None = None

    @property
    def failed(self) -> bool:
        """A finished attempt that needs a verdict: a failure state or a non-zero exit code."""
        if self.event != "finished":
            return False
        if self.state in FAILED_STATES:
            return True
        if self.state in ("COMPLETED", "CANCELLED", "PREEMPTED"):
            return False
        return self.exit_code not in (None, 0)

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> JobEvent:
        """The event :meth:`to_dict` wrote (a state record, e.g. a pending termination)."""
        return from_known_fields(cls, {**raw, "nodes": tuple(raw.get("nodes", ()))})

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["nodes"] = list(self.nodes)
        return out


def parse_job_event(value: bytes) -> JobEvent:
    """Parse one record of the job-events topic."""
    record = load_json_object(value)
    job_id, attempt = job_key(record)
    event = record.get("event")
    if event not in ("started", "finished"):
        raise RecordError("event must be started or finished")
    state = record.get("state")
    if state is not None and state not in JOB_STATES:
        raise RecordError(f"state must be one of {', '.join(sorted(JOB_STATES))}")
    exit_code = record.get("exit_code")
    if exit_code is not None:
        exit_code = _as_int(exit_code)
        if exit_code is None:
            raise RecordError("exit_code must be an integer")
    signal = record.get("signal")
    if signal is not None and not isinstance(signal, (int, str)):
        raise RecordError("signal must be an integer or a name")
    nodes = record.get("nodes", [])
    if not isinstance(nodes, list) or not all(isinstance(n, str) for n in nodes):
        raise RecordError("nodes must be a list of host names")
    gpus = _as_int(record.get("gpus", 0))
    if gpus is None or gpus < 0:
        raise RecordError("gpus must be an integer >= 0")
    ts = record.get("ts")
    if ts is not None and not isinstance(ts, (int, float, str)):
        raise RecordError("ts must be epoch seconds or an RFC 3339 string")
    return JobEvent(job_id, attempt, event, state, exit_code, signal, tuple(nodes), gpus, ts)


@dataclass(frozen=True, slots=True)
class Decision:
    """Sibylla's verdict on one failed attempt; the scheduler acts on ``action``.

    ``explored``: the verdict was ``deterministic`` but the action is ``default_policy``
    (exploration), so that the retry's outcome tells whether the verdict was right. Absent in
    decisions written before the field existed, which parse as False.

    The policy with memory (``streams/memory.py``) adds what a scheduler needs to act on a job's
    history: ``fingerprint`` of the attempt's root cause (category + masked cause line),
    ``recurrence`` (how many failed attempts of the job had that root, this one included),
    ``progressed`` (this attempt got further than every earlier one), ``exclude_nodes`` (every
    node to keep the job off, capped), ``retries_left`` (of the job's retry budget; None in
    decisions written before memory existed) and ``rule``, the rule that chose the action.
    """

    job_id: str
    attempt: int
    verdict: Verdict
    confidence: float
    category: str
    action: Action
    avoid_nodes: list[str]
    evidence: list[str]
    model_version: str
    decided_at: float
    latency_ms: float
    state: str = ""
    line_count: int = 0
    explored: bool = False
    fingerprint: str = ""
    recurrence: int = 0
    progressed: bool = False
    exclude_nodes: list[str] = field(default_factory=list)
    retries_left: int | None = None
    rule: str = ""
    schema_version: int = SCHEMA_VERSION

    def to_json(self) -> bytes:
        return orjson.dumps(asdict(self))

    @classmethod
    def from_json(cls, value: bytes) -> Decision:
        return from_known_fields(cls, load_json_object(value))


@dataclass(frozen=True, slots=True)
class Vote:
    """One opinion on a failed attempt's true class (retry outcome, a model, an operator)."""

    source: str
    label: Literal["deterministic", "nondeterministic"]
    weight: float


@dataclass(frozen=True, slots=True)
class Label:
    """The class a majority of votes gave an attempt: a training example for the trainer."""

    job_id: str
    attempt: int
    label: Literal["deterministic", "nondeterministic"]
    votes: list[Vote]
    log: str
    category: str = ""
    labeled_at: float = field(default_factory=time.time)
    schema_version: int = SCHEMA_VERSION

    def to_json(self) -> bytes:
        return orjson.dumps(asdict(self))

    @classmethod
    def from_json(cls, value: bytes) -> Label:
        raw = load_json_object(value)
        raw["votes"] = [from_known_fields(Vote, v) for v in raw.get("votes", [])]
        return from_known_fields(cls, raw)


@dataclass(frozen=True, slots=True)
class ModelAnnouncement:
    """A promoted model that workers should load (compacted topic, keyed by model name)."""

    name: str
    version: str
    sha256: str
    uri: str
    metrics: dict[str, Any] = field(default_factory=dict)
    announced_at: float = field(default_factory=time.time)
    schema_version: int = SCHEMA_VERSION

    def to_json(self) -> bytes:
        return orjson.dumps(asdict(self))

    @classmethod
    def from_json(cls, value: bytes) -> ModelAnnouncement:
        return from_known_fields(cls, load_json_object(value))


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A rejected record, its reason and its original bytes, for an operator to inspect."""

    reason: str
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes
    agent: str
    at: float = field(default_factory=time.time)

    def to_json(self) -> bytes:
        return orjson.dumps(
            {
                "schema_version": SCHEMA_VERSION,
                "reason": self.reason,
                "topic": self.topic,
                "partition": self.partition,
                "offset": self.offset,
                "key_b64": base64.b64encode(self.key).decode() if self.key is not None else None,
                "value_b64": base64.b64encode(self.value).decode(),
                "agent": self.agent,
                "at": self.at,
            }
        )
