"""Python records of the topic contract, with validation fast enough for the ingest path.

The JSON Schema files beside this module are the contract for outside tools; these functions
enforce the same rules by hand because ``jsonschema`` costs tens of microseconds per record and
the log topic carries hundreds of thousands of lines a second. A test checks that both agree.
Every parser raises :class:`RecordError` with a reason a human can act on; the agents route such
records to the dead-letter topic.
"""

from __future__ import annotations

import base64
import hashlib
import operator
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, Literal, TypeVar, get_args

import msgspec
import orjson

from sibylla.schemas.decode import fast_decoder
from sibylla.schemas.validate import (
    Check,
    ValidationFailure,
    compile_schema,
    glance_over_list,
    load_schema,
    schema_check,
)

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
    "REASON_CLASSES",
    "ReasonClass",
    "RecordError",
    "Vote",
    "job_key",
    "load_json_object",
    "parse_job_event",
    "parse_log_record",
    "parse_log_records",
]

SCHEMA_VERSION = 1

Verdict = Literal["deterministic", "nondeterministic", "unknown"]
Action = Literal["do_not_retry", "retry", "retry_elsewhere", "default_policy"]

# States that make a finished attempt a failure Sibylla must judge. CANCELLED is a user's
# choice and PREEMPTED a scheduler's, not failures of the job; both release the window unless
# the exit code says otherwise.
FAILED_STATES = frozenset({"FAILED", "NODE_FAIL", "OUT_OF_MEMORY", "TIMEOUT"})


ReasonClass = Literal["invalid_json", "not_an_object", "missing_job_id", "too_long",
                      "invalid_field"]
REASON_CLASSES: tuple[ReasonClass, ...] = get_args(ReasonClass)


class RecordError(ValueError):
    """A record breaks the contract; ``str(err)`` is the reason sent to the dead-letter topic.

    ``kind`` sorts the reason into a small fixed set of classes: the dead-letter metric is
    labelled by it (the reason itself names fields and sizes, too many values for a label).
    """

    def __init__(self, reason: str, kind: ReasonClass = "invalid_field") -> None:
        super().__init__(reason)
        self.kind: ReasonClass = kind


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


@dataclass(slots=True)
class LogChunk:
    """Lines of one job attempt from one Kafka record (a LogLine is a chunk of one line).

    Not frozen: one is built per record on the ingest path, and a frozen dataclass's
    ``__init__`` costs three times as much (1.6 against 0.55 us here)."""

    job_id: str
    attempt: int
    lines: list[str]
    eos: bool = False


def _as_int(value: Any) -> int:
    """An integer the schema accepted (JSON Schema counts ``2.0`` as one) as a Python int."""
    return value if type(value) is int else int(value)


def _checked(check: Check, record: dict[str, Any]) -> None:
    try:
        check(record)
    except ValidationFailure as exc:
        reason = str(exc)
        kind: ReasonClass = "missing_job_id" if reason.startswith("job_id ") else "invalid_field"
        raise RecordError(reason, kind) from None


_LOGLINE = schema_check("logline.schema.json")
_LOGBATCH = schema_check("logbatch.schema.json")
# A bare end-of-stream marker (``{"job_id": .., "eos": true}``) is a LogLine without a line:
# the same rules for every field it has.
_EOS_MARKER = compile_schema({**load_schema("logline.schema.json"), "required": ["job_id"]})
_JOBEVENT = schema_check("jobevent.schema.json")
_JOB_KEY = compile_schema({"type": "object", "required": ["job_id"], "properties": {
    name: load_schema("jobevent.schema.json")["properties"][name]
    for name in ("job_id", "attempt")}})


_LINE_OF = operator.itemgetter("line")  # a LogBatch entry's line, in C over the whole list

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


def load_json_object(value: bytes | None) -> dict[str, Any]:
    """A record's JSON object; :class:`RecordError` when it is not one."""
    if value is None:
        raise RecordError("tombstone: the record has no value", "invalid_json")
    try:
        record = orjson.loads(value)
    except orjson.JSONDecodeError as exc:
        raise RecordError(f"invalid JSON or UTF-8: {exc}", "invalid_json") from None
    if not isinstance(record, dict):
        raise RecordError("record is not a JSON object", "not_an_object")
    return record


def job_key(record: dict[str, Any]) -> tuple[str, int]:
    """A record's validated (job_id, attempt); the attempt defaults to 0."""
    _checked(_JOB_KEY, record)
    return record["job_id"], _as_int(record.get("attempt", 0))


def _lines_within(lines: list[str], max_line_bytes: int, where: str) -> list[str]:
    """``lines``, each at most ``max_line_bytes`` long in UTF-8. ``where`` names the field,
    ``{i}`` standing for a line's index (formatted only for the line found too long)."""
    # len() counts code points; UTF-8 needs at most 4 bytes each, so only long lines pay for
    # an exact byte count (and a record without one pays a single max() in C).
    if max(map(len, lines), default=0) * 4 <= max_line_bytes:
        return lines
    for i, line in enumerate(lines):
        if len(line) * 4 > max_line_bytes and len(line.encode()) > max_line_bytes:
            raise RecordError(f"{where.format(i=i)} longer than {max_line_bytes} bytes",
                              "too_long")
    return lines


def parse_log_record(
    value: bytes | None, max_line_bytes: int, field_map: FieldMap | None = None
) -> LogChunk:
    """Parse one record of the logs topic, a LogLine or a LogBatch, into a :class:`LogChunk`.

    The rules are the schema files' (``logline``, ``logbatch``) plus the worker's line length
    limit, which is a setting rather than part of the contract.
    """
    record = load_json_object(value)
    if field_map is not None:
        field_map.apply(record)
    return _chunk_of(record, max_line_bytes)


def parse_log_records(
    values: Sequence[bytes | None], max_line_bytes: int, field_map: FieldMap | None = None
) -> list[LogChunk | Exception]:
    """``parse_log_record`` of each value, in order; a record that fails gets its exception
    (a :class:`RecordError`, or any other error a parser bug raised) in its place, so one
    record never takes the others down.

    LogBatch records are decoded by the schema's msgspec decoder when it accepts them
    (:func:`_fast_batch`). One-line records (the LogLines that syslog-ng, rsyslog and Fluent
    Bit ship) are checked together, a field at a time across the records
    (:func:`~.validate.glance_over_list`): checked one by one, each cost ~1.4 us beside ~1.8
    us of JSON decoding. When the glance is not sure of every one, each is checked alone, as
    ``parse_log_record`` does.
    """
    decoded: list[LogChunk | dict[str, Any] | Exception] = []
    for value in values:
        chunk = _fast_batch(value, max_line_bytes) if field_map is None else None
        if chunk is not None:
            decoded.append(chunk)
            continue
        try:
            record = load_json_object(value)
            if field_map is not None:
                field_map.apply(record)
            decoded.append(record)
        except Exception as exc:  # noqa: BLE001 - the caller dead-letters it
            decoded.append(exc)
    one_line = [r for r in decoded if isinstance(r, dict) and _is_logline(r)]
    try:
        checked = bool(one_line) and _all_loglines_valid(one_line, max_line_bytes)
    except Exception:  # noqa: BLE001 - a glance that fails decides nothing
        checked = False
    out: list[LogChunk | Exception] = []
    for item in decoded:
        if not isinstance(item, dict):  # a chunk already, or the record's error
            out.append(item)
            continue
        try:
            out.append(_chunk_of(item, max_line_bytes, checked))
        except Exception as exc:  # noqa: BLE001 - the caller dead-letters it
            out.append(exc)
    return out


_LOGLINES = glance_over_list("logline.schema.json")
_LOGBATCH_DECODER = fast_decoder("logbatch.schema.json")
_LINE_ATTR = operator.attrgetter("line")


def _fast_batch(value: bytes | None, max_line_bytes: int) -> LogChunk | None:
    """The chunk of a LogBatch record that the schema's msgspec decoder accepts
    (schemas/decode.py): most of a batched line's parsing cost, in C. None for any other
    record, and for one the decoder refuses or that holds a line too long: the general path
    then says why it is rejected, or accepts what msgspec is stricter on (``"attempt":
    2.0``)."""
    if value is None or b'"lines"' not in value:
        return None  # a LogLine, an end-of-stream marker, a tombstone
    try:
        batch = _LOGBATCH_DECODER.decode(value)
        lines = _lines_within(list(map(_LINE_ATTR, batch.lines)), max_line_bytes, "")
    except Exception:  # noqa: BLE001 - the general path decides it, and says why
        return None
    attempt = 0 if batch.attempt is msgspec.UNSET else batch.attempt
    return LogChunk(batch.job_id, attempt, lines, batch.eos is True)


def _is_logline(record: dict[str, Any]) -> bool:
    """A one-line record (LogLine), by its fields; the schema then says whether it is valid."""
    return "line" in record and "lines" not in record


def _all_loglines_valid(records: list[dict[str, Any]], max_line_bytes: int) -> bool:
    """Whether every one of ``records`` (each a LogLine by :func:`_is_logline`) is valid and
    within the line limit; False: some may not be."""
    if not _LOGLINES(records):
        return False
    return max(map(len, map(_LINE_OF, records))) * 4 <= max_line_bytes


def _chunk_of(record: dict[str, Any], max_line_bytes: int,
              loglines_checked: bool = False) -> LogChunk:
    """The chunk of one decoded log record (see :func:`parse_log_record`).
    ``loglines_checked``: a LogLine is already known valid and within the limit."""
    if "lines" in record:
        _checked(_LOGBATCH, record)
        lines = _lines_within(list(map(_LINE_OF, record["lines"])), max_line_bytes,
                              "lines[{i}].line")
    elif "line" not in record and record.get("eos") is True:
        _checked(_EOS_MARKER, record)
        lines = []
    elif loglines_checked and "line" in record:  # a LogLine, and they all passed
        lines = [record["line"]]
    else:
        _checked(_LOGLINE, record)
        lines = _lines_within([record["line"]], max_line_bytes, "line")
    return LogChunk(record["job_id"], _as_int(record.get("attempt", 0)), lines,
                    record.get("eos", False))


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
        # By field name, not asdict(): that deep-copies every value (14 us per event, on the
        # terminations agent's path).
        out = {name: getattr(self, name) for name in _JOB_EVENT_FIELDS}
        out["nodes"] = list(self.nodes)
        return out


_JOB_EVENT_FIELDS = tuple(f.name for f in fields(JobEvent))


def parse_job_event(value: bytes | None) -> JobEvent:
    """Parse one record of the job-events topic (rules: ``jobevent.schema.json``)."""
    record = load_json_object(value)
    _checked(_JOBEVENT, record)
    exit_code = record.get("exit_code")
    signal = record.get("signal")
    return JobEvent(
        record["job_id"], _as_int(record.get("attempt", 0)), record["event"],
        record.get("state"), None if exit_code is None else _as_int(exit_code),
        _as_int(signal) if type(signal) is float else signal, tuple(record.get("nodes", ())),
        _as_int(record.get("gpus", 0)), record.get("ts"))


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
        return orjson.dumps(self)  # orjson writes a dataclass as asdict would, ~20x faster

    @classmethod
    def from_json(cls, value: bytes) -> Decision:
        return from_known_fields(cls, load_json_object(value))


@dataclass(frozen=True, slots=True)
class Vote:
    """One opinion on a failed attempt's true class (retry outcome, a model, an operator).

    ``by``: who cast it, for an operator's vote (the name tied to the bearer token the label
    came with); empty for the others and in votes written before the field existed.
    """

    source: str
    label: Literal["deterministic", "nondeterministic"]
    weight: float
    by: str = ""


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
        return orjson.dumps(self)  # orjson writes a dataclass as asdict would, ~20x faster

    @classmethod
    def from_json(cls, value: bytes) -> Label:
        raw = load_json_object(value)
        raw["votes"] = [from_known_fields(Vote, v) for v in raw.get("votes", [])]
        return from_known_fields(cls, raw)


@dataclass(frozen=True, slots=True)
class ModelAnnouncement:
    """A promoted model that workers should load (compacted topic, keyed by model name).

    ``sequence`` only grows from one announcement of the trainer to the next (a rollback is a
    new announcement), so a worker refuses a replayed older one; ``signature`` is the trainer's
    Ed25519 signature of the rest (online_learning/signing.py). Both are absent (0, "") in
    announcements written before they existed, which workers then treat as unsigned.
    """

    name: str
    version: str
    sha256: str
    uri: str
    metrics: dict[str, Any] = field(default_factory=dict)
    announced_at: float = field(default_factory=time.time)
    sequence: int = 0
    signature: str = ""
    schema_version: int = SCHEMA_VERSION

    def to_json(self) -> bytes:
        return orjson.dumps(self)  # orjson writes a dataclass as asdict would, ~20x faster

    @classmethod
    def from_json(cls, value: bytes) -> ModelAnnouncement:
        return from_known_fields(cls, load_json_object(value))


# A dead letter carries its original record whole up to this size, else an excerpt: base64
# inflates by a third, and a record near the broker's message limit (1 MiB by default) would
# otherwise make a dead letter the broker refuses, and the record would be lost.
DEAD_LETTER_MAX_BYTES = 64 * 1024
_MAX_REASON = 1024


def _excerpt(data: bytes | None, limit: int, name: str) -> dict[str, Any]:
    """``data`` in base64, whole or its first ``limit`` bytes with its size and sha256."""
    if data is None:
        return {f"{name}_b64": None}
    if len(data) <= limit:
        return {f"{name}_b64": base64.b64encode(data).decode()}
    return {f"{name}_b64": base64.b64encode(data[:limit]).decode(), f"{name}_truncated": True,
            f"{name}_size": len(data), f"{name}_sha256": hashlib.sha256(data).hexdigest()}


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A rejected record, its reason and its original bytes, for an operator to inspect.

    ``value`` is None for a tombstone. Bytes beyond :data:`DEAD_LETTER_MAX_BYTES` are cut
    (``value_truncated``, with the original's size and sha256): the original stays at its
    topic, partition and offset for as long as that topic's retention keeps it.
    """

    reason: str
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    agent: str
    at: float = field(default_factory=time.time)

    def to_json(self) -> bytes:
        reason = self.reason if len(self.reason) <= _MAX_REASON else (
            self.reason[:_MAX_REASON] + "...")
        return orjson.dumps(
            {
                "schema_version": SCHEMA_VERSION,
                "reason": reason,
                "topic": self.topic,
                "partition": self.partition,
                "offset": self.offset,
                **_excerpt(self.key, DEAD_LETTER_MAX_BYTES, "key"),
                **_excerpt(self.value, DEAD_LETTER_MAX_BYTES, "value"),
                "agent": self.agent,
                "at": self.at,
            }
        )
