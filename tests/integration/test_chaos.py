"""The short fault campaign (``bench/chaos.py --quick``) on Apache Kafka: two workers
SIGKILLed and restarted, a broker restart mid-stream, 10^4 fuzzed records among the jobs, and
every promise checked from the topics (about 2-3 minutes). The long campaign the README
reports is ``python bench/chaos.py --broker kafka``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.fixtures import only_brokers

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


@only_brokers("kafka")
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_short_fault_campaign_loses_no_line_no_decision_and_no_bad_record(
        broker, tmp_path: Path) -> None:
    # The campaign starts a broker of its own (it restarts it); ``broker`` only selects Kafka.
    report_path = tmp_path / "report.json"
    run = subprocess.run(
        [sys.executable, "bench/chaos.py", "--broker", "kafka", "--quick",
         "--json", str(report_path), "--workdir", str(tmp_path / "run")],
        cwd=ROOT, capture_output=True, text=True, timeout=850)
    assert report_path.exists(), run.stderr[-3000:]
    report = json.loads(report_path.read_text())
    findings, summary = report["findings"], report["summary"]
    assert findings == {
        "lost_decisions": [], "conflicting_verdicts": [], "short_windows": [],
        "long_windows": [], "decided_completed": [], "bad_records_unaccounted": 0,
        "valid_records_dead_lettered": 0, "unexpected_exits": [],
    }, run.stderr[-3000:]
    # The faults really happened, and the fuzz really held bad records.
    assert summary["kills"] >= 3 and summary["broker_restarts"] == 1
    assert summary["bad_records_sent"] > 1000 and summary["valid_fuzz_records"] > 0
    assert run.returncode == 0
