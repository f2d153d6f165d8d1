"""The hand-written validators agree with the JSON Schema files outside tools validate with."""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import re
from importlib import resources
from pathlib import Path

import jsonschema
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sibylla.schemas.records import (
    DEAD_LETTER_MAX_BYTES,
    DeadLetter,
    Decision,
    FieldMap,
    Label,
    ModelAnnouncement,
    RecordError,
    Vote,
    parse_job_event,
    parse_log_record,
    parse_log_records,
)
from sibylla.schemas.validate import compile_schema
from tests.schemas.fixtures import broken_batch, schema_valid, shipped_batch

MAX_LINE = 512


def _schema(name: str) -> dict:
    return json.loads(resources.files("sibylla.schemas").joinpath(name).read_text())


LOGLINE, LOGBATCH = _schema("logline.schema.json"), _schema("logbatch.schema.json")
JOBEVENT, DECISION = _schema("jobevent.schema.json"), _schema("decision.schema.json")

# Beyond 64 bits: orjson (which re-serialises accepted values) cannot write them, so the
# schemas bound every integer; 1e20 parses as a float that is an integer.
huge = st.sampled_from([2**63, -(2**63) - 1, 1e20, -1e20, 2**64])
scalars = st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.text(max_size=8),
                    st.floats(allow_nan=False, allow_infinity=False), huge, st.just({}),
                    st.just([]))
optional_fields = {"host": st.one_of(st.text(max_size=5), scalars),
                   "rank": st.one_of(st.integers(-2, 8), scalars), "ts": scalars}
line_obj = st.fixed_dictionaries(
    {"line": st.one_of(st.text(max_size=40), scalars)},
    optional={"stream": st.sampled_from(["stdout", "stderr", "tty", 3]), **optional_fields})
records = st.fixed_dictionaries(
    {},
    optional={
        "job_id": st.one_of(st.text(max_size=10), scalars),
        "attempt": st.one_of(st.integers(-2, 5), scalars),
        "line": st.one_of(st.text(max_size=40), scalars),
        "stream": st.sampled_from(["stdout", "stderr", "other"]),
        "lines": st.one_of(st.lists(line_obj, max_size=4), scalars),
        "eos": st.one_of(st.booleans(), scalars),
        **optional_fields,
    })


def _decoded(record: dict) -> tuple[bytes, dict]:
    """A record's bytes, and the record as a JSON reader of the worker's kind decodes them:
    an integer beyond 64 bits becomes a float, rounded, and both sides judge that value."""
    value = json.dumps(record).encode()
    return value, orjson.loads(value)


@settings(max_examples=400, deadline=None)
@given(records)
def test_log_parser_accepts_exactly_what_the_schema_accepts(record: dict) -> None:
    if "lines" not in record and "line" not in record and record.get("eos") is True:
        return  # a bare end-of-stream marker: a parser extension the schema does not require
    value, record = _decoded(record)
    try:
        chunk = parse_log_record(value, MAX_LINE)
    except RecordError:
        accepted = False
    else:
        accepted = True
        expected = ([e["line"] for e in record["lines"]] if "lines" in record
                    else [record["line"]])
        assert chunk.lines == expected
        assert chunk.job_id == record["job_id"]
    assert accepted == schema_valid(record, LOGBATCH if "lines" in record else LOGLINE)


@given(st.binary(max_size=64))
def test_any_bytes_either_parse_or_raise_a_record_error(value: bytes) -> None:
    try:
        parse_log_record(value, MAX_LINE)
    except RecordError as exc:
        assert str(exc)


# Valid LogLines, as shippers send them by the thousand (some over the line limit, some
# not ASCII): the records the worker parses together rather than one by one.
shipped_line = st.fixed_dictionaries(
    {"job_id": st.text(min_size=1, max_size=6), "line": st.text(max_size=160)},
    optional={"attempt": st.integers(0, 3), "ts": st.one_of(st.floats(-1e6, 1e12), st.text()),
              "stream": st.sampled_from(["stdout", "stderr"]), "eos": st.booleans(),
              "host": st.text(max_size=4), "rank": st.integers(0, 7), "extra": scalars})


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(shipped_line, shipped_batch, broken_batch(), records,
                          st.binary(max_size=8)), max_size=8),
       st.booleans())
def test_records_parsed_together_come_out_as_parsed_one_by_one(
        batch: list[dict | bytes], mapped: bool) -> None:
    """Whatever a poll brings, each record's chunk or error is the one it has alone: a bad
    record costs only itself, and no record passes together that fails alone."""
    values = [v if isinstance(v, bytes) else json.dumps(v).encode() for v in batch]
    fmap = FieldMap.parse("line=log") if mapped else None
    together = parse_log_records(values, MAX_LINE, fmap)
    assert len(together) == len(values)
    for value, got in zip(values, together, strict=True):
        try:
            alone = parse_log_record(value, MAX_LINE, fmap)
        except RecordError as exc:
            assert isinstance(got, RecordError) and str(got) == str(exc)
            assert got.kind == exc.kind
        else:
            assert got == alone


def test_lines_longer_than_the_limit_are_rejected_with_the_limit_in_the_reason() -> None:
    with pytest.raises(RecordError, match="512 bytes"):
        parse_log_record(orjson.dumps({"job_id": "j", "line": "é" * 300}), MAX_LINE)


def test_a_shipper_record_is_mapped_by_the_field_map() -> None:
    fmap = FieldMap.parse("line=log,job_id=kubernetes.labels.job-name")
    raw = {"log": "CUDA out of memory", "kubernetes": {"labels": {"job-name": "llm-7"}}}
    chunk = parse_log_record(orjson.dumps(raw), MAX_LINE, fmap)
    assert (chunk.job_id, chunk.lines) == ("llm-7", ["CUDA out of memory"])
    with pytest.raises(ValueError, match="NAME=dotted.path"):
        FieldMap.parse("line")


@settings(max_examples=200, deadline=None)
@given(st.fixed_dictionaries(
    {"job_id": st.one_of(st.text(min_size=1, max_size=8), scalars),
     "event": st.sampled_from(["started", "finished", "paused"])},
    optional={"state": st.sampled_from(["FAILED", "COMPLETED", "NODE_FAIL", "EXPLODED", None]),
              "exit_code": st.one_of(st.integers(-1, 300), scalars),
              "signal": st.one_of(st.integers(-1, 64), scalars),
              "nodes": st.one_of(st.lists(st.text(max_size=5), max_size=3), scalars),
              "gpus": st.one_of(st.integers(-1, 16), scalars),
              "ts": scalars}))
def test_job_event_parser_agrees_with_the_schema(record: dict) -> None:
    value, record = _decoded(record)
    try:
        parse_job_event(value)
        accepted = True
    except RecordError:
        accepted = False
    try:
        jsonschema.validate(record, JOBEVENT)
        valid = True
    except jsonschema.ValidationError:
        valid = False
    assert accepted == valid


@pytest.mark.parametrize(("state", "exit_code", "failed"), [
    ("FAILED", 1, True), ("NODE_FAIL", None, True), ("OUT_OF_MEMORY", 137, True),
    ("TIMEOUT", None, True), ("COMPLETED", 0, False), ("CANCELLED", 1, False),
    (None, 3, True), (None, 0, False),
])
def test_which_finished_attempts_need_a_verdict(state, exit_code, failed) -> None:
    record = {"job_id": "j", "event": "finished", "state": state, "exit_code": exit_code}
    assert parse_job_event(json.dumps(record).encode()).failed is failed


def test_a_decision_is_valid_against_its_published_schema() -> None:
    decision = Decision("j", 2, "deterministic", 0.99, "syntax_error", "do_not_retry", [],
                        ["SyntaxError: invalid syntax"], "gru-1", 1.0, 12.5)
    jsonschema.validate(orjson.loads(decision.to_json()), DECISION)
    assert Decision.from_json(decision.to_json()) == decision


def test_an_explored_decision_round_trips_and_is_valid_against_the_schema() -> None:
    decision = Decision("j", 0, "deterministic", 0.97, "syntax_error", "default_policy", [],
                        ["SyntaxError: invalid syntax"], "gru-1", 1.0, 12.5, explored=True)
    raw = orjson.loads(decision.to_json())
    assert raw["explored"] is True
    jsonschema.validate(raw, DECISION)
    assert Decision.from_json(decision.to_json()) == decision
    assert orjson.loads(Decision.from_json(decision.to_json()).to_json())["explored"] is True


def test_a_decision_with_the_memory_fields_round_trips_and_is_valid() -> None:
    decision = Decision("j", 1, "nondeterministic", 0.99, "gpu_hardware_error",
                        "retry_elsewhere", ["gpu07"], ["NVRM: Xid 79"], "gru-1", 1.0, 12.5,
                        fingerprint="0123abcd0123abcd", recurrence=2, progressed=True,
                        exclude_nodes=["gpu03", "gpu07"], retries_left=1,
                        rule="hardware_blamed")
    raw = orjson.loads(decision.to_json())
    jsonschema.validate(raw, DECISION)
    assert Decision.from_json(decision.to_json()) == decision
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**raw, "retries_left": -1}, DECISION)
    # Made without memory (older workers): retries_left is null, still valid.
    jsonschema.validate(orjson.loads(dataclasses.replace(decision, retries_left=None)
                                     .to_json()), DECISION)


def test_a_decision_written_before_exploration_existed_still_parses() -> None:
    # As published by earlier workers (and still on the topic): no "explored" field.
    old = {"job_id": "j", "attempt": 1, "verdict": "deterministic", "confidence": 0.99,
           "category": "syntax_error", "action": "do_not_retry", "avoid_nodes": [],
           "evidence": ["SyntaxError"], "model_version": "gru-1", "decided_at": 1.0,
           "latency_ms": 3.0, "state": "FAILED", "line_count": 4, "schema_version": 1}
    jsonschema.validate(old, DECISION)
    decision = Decision.from_json(orjson.dumps(old))
    assert (decision.action, decision.explored) == ("do_not_retry", False)


def test_records_from_a_newer_writer_with_more_fields_still_parse() -> None:
    """Records may gain fields without a new schema_version: an older reader (a scheduler's
    follower, a worker during a rolling upgrade) takes what it knows and ignores the rest."""
    decision = {**orjson.loads(Decision("j", 0, "deterministic", 0.97, "syntax_error",
                                        "do_not_retry", [], [], "gru-1", 1.0, 12.5).to_json()),
                "cost_gpu_hours": 12.0}
    assert Decision.from_json(orjson.dumps(decision)).action == "do_not_retry"
    label = {**orjson.loads(Label("j", 0, "deterministic", [Vote("outcome", "deterministic", 2.0)],
                                  "log").to_json()), "cluster": "a100-east"}
    label["votes"][0]["at"] = 5.0
    assert Label.from_json(orjson.dumps(label)).votes == [Vote("outcome", "deterministic", 2.0)]
    ann = {**orjson.loads(ModelAnnouncement("m", "v2", "ab" * 32, "file:///m/v2").to_json()),
           "size": 123}
    assert ModelAnnouncement.from_json(orjson.dumps(ann)).version == "v2"
    del decision["verdict"]  # a missing field is still an error
    with pytest.raises(TypeError):
        Decision.from_json(orjson.dumps(decision))


def test_the_schema_refuses_an_explored_flag_that_is_not_a_boolean() -> None:
    decision = orjson.loads(Decision("j", 0, "deterministic", 0.97, "syntax_error",
                                     "default_policy", [], [], "gru-1", 1.0, 12.5).to_json())
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**decision, "explored": "yes"}, DECISION)


@pytest.mark.parametrize("value", [b"[]", b"null", b"1", b"\"text\"", b"{not json"])
def test_a_record_that_is_not_a_json_object_is_a_record_error(value: bytes) -> None:
    """Consumers of labels and announcements skip what they cannot read; they must not crash
    on a stray value (the trainer re-reads its topic from the start after every restart)."""
    for parse in (Decision.from_json, Label.from_json, ModelAnnouncement.from_json):
        with pytest.raises(RecordError):
            parse(value)


def test_a_job_event_kept_in_state_comes_back_as_it_was() -> None:
    from sibylla.schemas.records import JobEvent

    event = JobEvent("j", 2, "finished", "NODE_FAIL", 137, "SIGKILL", ("gpu-1", "gpu-2"), 16,
                     1.5)
    assert JobEvent.from_dict(orjson.loads(orjson.dumps(event.to_dict()))) == event
    assert JobEvent.from_dict({"job_id": "j", "attempt": 0, "event": "started"}).nodes == ()


@pytest.mark.parametrize(("record", "named"), [
    ({"job_id": "j", "line": "x", "rank": -1}, "rank"),
    ({"job_id": "j", "line": "x", "host": 5}, "host"),
    ({"job_id": "j", "line": "x", "ts": {}}, "ts"),
    ({"job_id": "j", "lines": [{"line": "x", "rank": -1}]}, "lines[0].rank"),
    ({"job_id": "j", "attempt": 1e20, "line": "x"}, "attempt"),
])
def test_log_records_the_schema_rejects_are_rejected_naming_the_field(record, named) -> None:
    with pytest.raises(RecordError, match=re.escape(named)):
        parse_log_record(json.dumps(record).encode(), MAX_LINE)


@pytest.mark.parametrize("field", ["attempt", "exit_code", "gpus", "signal"])
def test_job_event_integers_beyond_64_bits_are_rejected_not_crashing_later(field) -> None:
    # Accepted, such a value would crash the worker when it stores the pending termination.
    record = {"job_id": "j", "event": "finished", "state": "FAILED", field: 1e20}
    with pytest.raises(RecordError, match=field):
        parse_job_event(json.dumps(record).encode())


def test_a_tombstone_is_a_record_error() -> None:
    with pytest.raises(RecordError, match="tombstone"):
        parse_log_record(None, MAX_LINE)
    with pytest.raises(RecordError, match="tombstone"):
        parse_job_event(None)


@settings(max_examples=300, deadline=None)
@given(st.fixed_dictionaries(
    {"job_id": st.text(min_size=1, max_size=8), "event": st.just("finished")},
    optional={"attempt": st.one_of(st.integers(0, 2**70), st.floats(0, 1e25)),
              "exit_code": st.one_of(st.integers(-(2**70), 2**70), st.floats(-1e25, 1e25)),
              "gpus": st.one_of(st.integers(0, 2**70), st.floats(0, 1e25)),
              "ts": st.one_of(st.integers(-(2**70), 2**70), st.floats(-1e25, 1e25))}))
def test_every_accepted_job_event_can_be_stored(record: dict) -> None:
    try:
        job = parse_job_event(json.dumps(record).encode())
    except RecordError:
        return
    assert orjson.loads(orjson.dumps(job.to_dict()))["job_id"] == record["job_id"]


def test_every_schema_file_compiles_and_an_unknown_keyword_is_refused() -> None:
    for path in resources.files("sibylla.schemas").iterdir():
        if path.name.endswith(".schema.json"):
            compile_schema(json.loads(path.read_text()))
    with pytest.raises(ValueError, match="oneOf"):
        compile_schema({"oneOf": [{"type": "string"}]})


@pytest.mark.parametrize("value", [None, b"{}", b"x" * (1 << 20)])
def test_a_dead_letter_keeps_any_record_within_a_size_the_broker_accepts(value) -> None:
    letter = orjson.loads(DeadLetter("too long", "sibylla.logs", 3, 41, b"job-1", value,
                                     "ingest").to_json())
    jsonschema.validate(letter, _schema("deadletter.schema.json"))
    assert (letter["partition"], letter["offset"]) == (3, 41)  # where the original still is
    if value is None:
        assert letter["value_b64"] is None
    elif len(value) <= DEAD_LETTER_MAX_BYTES:
        assert base64.b64decode(letter["value_b64"]) == value
    else:
        assert len(orjson.dumps(letter)) < 100 * 1024
        assert letter["value_truncated"] and letter["value_size"] == len(value)
        assert letter["value_sha256"] == hashlib.sha256(value).hexdigest()
        assert value.startswith(base64.b64decode(letter["value_b64"]))


def test_signed_announcements_and_operator_votes_fit_their_schemas_and_old_records_parse(
        tmp_path: Path) -> None:
    """A signed announcement (sequence, signature) and an operator's vote with its name
    validate; records written before those fields existed still validate and parse."""
    from sibylla.online_learning.announce import announcement
    from sibylla.online_learning.signing import generate_key_pair, load_private_key

    generate_key_pair(tmp_path / "k")
    model = tmp_path / "m.safetensors"
    model.write_bytes(b"weights")
    signed = orjson.loads(announcement("m", "v2", model, "ab" * 32, {"real": 0.9}, 7,
                                       load_private_key(tmp_path / "k")).to_json())
    schema = _schema("model_announcement.schema.json")
    jsonschema.validate(signed, schema)
    old = {k: v for k, v in signed.items() if k not in ("sequence", "signature")}
    jsonschema.validate(old, schema)
    parsed = ModelAnnouncement.from_json(orjson.dumps(old))
    assert (parsed.sequence, parsed.signature) == (0, "")
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**signed, "signature": "not base64!"}, schema)
    label = orjson.loads(Label("j", 0, "deterministic",
                               [Vote("operator", "deterministic", 10.0, "alice")], "log"
                               ).to_json())
    jsonschema.validate(label, _schema("label.schema.json"))
    assert Label.from_json(orjson.dumps(label)).votes[0].by == "alice"
