"""The shipper: how it cuts lines into records, and against a real broker, that what it reports
shipped is on the topic, in records the broker takes, and that what the broker refused is
reported, not lost in silence."""

from __future__ import annotations

import asyncio
from pathlib import Path

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sibylla.schemas.records import parse_log_record
from sibylla.streams.ship import RECORD_MAX_BYTES, DeliveryError, Shipper, _parts
from sibylla.streams.topics import ensure_topics
from tests.integration.fixtures import (
    create_topic_taking_at_most,
    make_settings,
    only_brokers,
    read_all,
)


@given(st.lists(st.binary(min_size=1, max_size=300), max_size=60),
       st.integers(1, 20), st.integers(1, 1000))
def test_records_keep_every_line_in_order_within_both_bounds(
        entries: list[bytes], max_lines: int, max_bytes: int) -> None:
    parts = _parts(entries, max_lines, max_bytes)
    assert [e for part in parts for e in part] == entries
    assert parts and all(part for part in parts[1:])  # one (maybe empty) run for no lines
    for part in parts:
        assert len(part) <= max_lines
        # over the byte bound only as a single entry that alone exceeds it
        assert sum(len(e) + 1 for e in part) - 1 <= max_bytes or len(part) == 1


@pytest.mark.integration
def test_long_lines_ship_in_records_the_broker_takes(
        broker: object, unique_prefix: str, tmp_path: Path) -> None:
    # 200 lines at the contract's 16 KiB limit: 3.2 MB, three times what Kafka takes in one
    # record batch by default (message.max.bytes, 1 MiB). Cut by line count alone, the record
    # was refused and the lines were gone while the shipper reported them shipped.
    settings = make_settings(broker.bootstrap_servers,  # type: ignore[attr-defined]
                             unique_prefix, tmp_path)
    asyncio.run(ensure_topics(settings))
    lines = [f"{i:04d} " + "x" * 16_000 for i in range(200)]

    async def ship() -> None:
        async with Shipper(settings) as shipper:
            await shipper.send_lines("job-long", lines, attempt=3, eos=True)
    asyncio.run(ship())

    records = asyncio.run(read_all(settings, "logs", idle_s=2.0))
    chunks = [parse_log_record(orjson.dumps(r), settings.max_line_bytes) for r in records]
    assert [ln for c in chunks for ln in c.lines] == lines
    assert {(c.job_id, c.attempt) for c in chunks} == {("job-long", 3)}
    assert [c.eos for c in chunks] == [False] * (len(chunks) - 1) + [True]
    assert all(len(orjson.dumps(r)) <= RECORD_MAX_BYTES for r in records)


@pytest.mark.integration
@only_brokers("kafka")  # Tansu takes records over a topic's max.message.bytes
def test_a_record_the_broker_refuses_is_reported_at_flush(
        broker: object, unique_prefix: str, tmp_path: Path) -> None:
    settings = make_settings(broker.bootstrap_servers,  # type: ignore[attr-defined]
                             unique_prefix, tmp_path)
    topic = settings.topic("small")
    asyncio.run(create_topic_taking_at_most(settings, topic, 1024))

    async def ship() -> None:
        async with Shipper(settings) as shipper:
            await shipper.send_raw(topic, b"job-a", b"a small record")
            await shipper.flush()  # taken: no error
            await shipper.send_raw(topic, b"job-a", b"y" * 4096)  # over the topic's limit
            await shipper.flush()
    with pytest.raises(DeliveryError, match="1 record"):
        asyncio.run(ship())
