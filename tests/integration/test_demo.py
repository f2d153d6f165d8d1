"""README's first command: ``sibylla demo`` on the embedded broker, from nothing."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration


def test_the_demo_decides_every_replayed_job_and_exits_zero() -> None:
    env = {k: v for k, v in os.environ.items() if k != "SIBYLLA_BOOTSTRAP_SERVERS"}
    done = subprocess.run(
        [sys.executable, "-m", "sibylla", "demo", "--jobs-per-class", "1", "--timeout", "150"],
        capture_output=True, text=True, timeout=240, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [line for line in done.stdout.splitlines() if line.startswith("demo-")]
    assert len(rows) >= 10, done.stdout
    verdicts = {row.split()[1] for row in rows}
    assert verdicts <= {"deterministic", "nondeterministic", "unknown"}
    assert "deterministic" in verdicts and "nondeterministic" in verdicts
    assert "started Tansu" in done.stderr
