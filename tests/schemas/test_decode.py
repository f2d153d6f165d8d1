"""The msgspec decoders generated from the schema files: never more lenient than the schema,
and taking the LogBatches shippers send, so that the worker's fast path is the one used."""

from __future__ import annotations

import json

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sibylla.schemas.decode import Unsupported, fast_decoder, msgspec_type
from sibylla.schemas.records import parse_log_records
from sibylla.schemas.validate import load_schema
from tests.schemas.fixtures import broken_batch, schema_valid, shipped_batch

LOGBATCH = load_schema("logbatch.schema.json")
DECODER = fast_decoder("logbatch.schema.json")


@settings(max_examples=600, deadline=None)
@given(st.one_of(shipped_batch, broken_batch()))
def test_the_decoder_accepts_no_record_that_the_schema_refuses(record: dict) -> None:
    value = json.dumps(record).encode()
    try:
        decoded = DECODER.decode(value)
    except msgspec.DecodeError:
        return  # refused: the compiled check decides it (stricter is allowed)
    assert schema_valid(json.loads(value), LOGBATCH), f"accepted what the schema refuses: {record}"
    assert decoded.job_id == record["job_id"]
    assert [e.line for e in decoded.lines] == [e["line"] for e in record["lines"]]


@settings(max_examples=200, deadline=None)
@given(shipped_batch)
def test_every_valid_batch_is_decoded_not_left_to_the_slow_path(record: dict) -> None:
    decoded = DECODER.decode(json.dumps(record).encode())
    assert (decoded.job_id, [e.line for e in decoded.lines]) == (
        record["job_id"], [e["line"] for e in record["lines"]])


def test_the_batches_shippers_send_are_decoded_not_left_to_the_slow_path() -> None:
    record = {"job_id": "train-7", "attempt": 2, "eos": True, "lines": [
        {"ts": 1764979200.25, "stream": "stderr", "line": "RuntimeError: CUDA error",
         "host": "gpu-3", "rank": 0},
        {"ts": "2026-12-04T19:00:00Z", "line": "é ünïcode"},
        {"ts": 1764979200, "line": ""},
        {"line": "x", "added_by_a_newer_shipper": {"any": "value"}}]}
    decoded = DECODER.decode(json.dumps(record).encode())
    assert (decoded.job_id, decoded.attempt, decoded.eos) == ("train-7", 2, True)
    assert [e.line for e in decoded.lines] == [e["line"] for e in record["lines"]]
    assert decoded.lines[3].stream is msgspec.UNSET


def test_a_float_timestamp_just_beyond_the_64_bit_bound_is_refused_as_the_schema_does() -> None:
    value = b'{"job_id": "j", "lines": [{"line": "x", "ts": 9223372036854775808.0}]}'
    assert not schema_valid(json.loads(value), LOGBATCH)
    with pytest.raises(msgspec.ValidationError, match="ts"):
        DECODER.decode(value)
    [chunk] = parse_log_records([value], 512)
    assert isinstance(chunk, Exception) and "ts" in str(chunk)


def test_an_integral_float_attempt_is_left_to_the_compiled_check_which_accepts_it() -> None:
    value = b'{"job_id": "j", "attempt": 2.0, "lines": [{"line": "x"}]}'
    with pytest.raises(msgspec.ValidationError):
        DECODER.decode(value)
    [chunk] = parse_log_records([value], 512)
    assert not isinstance(chunk, Exception)
    assert (chunk.attempt, chunk.lines) == (2, ["x"])


@pytest.mark.parametrize("schema", [
    {"type": "string", "pattern": "^a"},
    {"const": 1},
    {"type": "null"},
    {"enum": [1, 2]},
    {"type": "array"},
    {"type": "object", "required": ["a"]},
    {},
])
def test_a_schema_the_decoder_would_not_enforce_alike_gets_no_decoder(schema: dict) -> None:
    with pytest.raises(Unsupported):
        msgspec_type(schema)


def test_a_batch_with_a_line_over_the_limit_is_rejected_naming_that_line() -> None:
    value = json.dumps({"job_id": "j", "lines": [{"line": "ok"}, {"line": "é" * 300}]}).encode()
    DECODER.decode(value)  # valid by the schema: the limit is the worker's setting
    [chunk] = parse_log_records([value], 512)
    assert isinstance(chunk, Exception)
    assert "lines[1].line longer than 512 bytes" in str(chunk)
