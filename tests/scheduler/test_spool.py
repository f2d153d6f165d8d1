"""The epilog's spool: attempts kept while the broker was away come back whole, oldest first,
and a damaged entry never blocks the ones after it."""

from __future__ import annotations

from pathlib import Path

from sibylla.scheduler.spool import Shipment, Spool
from sibylla.schemas.records import JobEvent


def _shipment(job_id: str, attempt: int = 0) -> Shipment:
    event = JobEvent(job_id, attempt, "finished", "FAILED", 1, 0, ("gpu01",), 8, 1.5)
    return Shipment(event, (("stdout", ("epoch 1", "NCCL timeout ü")), ("stderr", ())))


def test_spooled_attempts_come_back_whole_and_oldest_first(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "spool")
    kept = [_shipment("7"), _shipment("a/b", 2), _shipment("7", 1)]
    for shipment in kept:
        spool.put(shipment)
    assert [spool.load(path) for path in spool.paths()] == kept


def test_a_damaged_entry_is_set_aside_and_the_others_still_load(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "spool")
    first = spool.put(_shipment("1"))
    second = spool.put(_shipment("2"))
    first.write_bytes(b'{"event": {"job_id": "1"')  # cut short (a full disk, a crash)
    loaded = [spool.load(path) for path in spool.paths()]
    assert loaded == [None, _shipment("2")]
    assert spool.paths() == [second]
    assert first.with_suffix(".bad").exists()


def test_only_one_epilog_at_a_time_drains_the_spool(tmp_path: Path) -> None:
    """slurmctld runs several epilogs at once: two draining together would publish each
    spooled attempt twice."""
    spool = Spool(tmp_path / "spool")
    with spool.draining() as first:
        with Spool(tmp_path / "spool").draining() as second:
            assert (first, second) == (True, False)
    with spool.draining() as later:
        assert later
