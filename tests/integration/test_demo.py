"""README's first command: ``sibylla demo`` on the embedded broker, from nothing: decisions,
labels from retry outcomes, a gated promotion and a decision by the promoted model."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration


def test_the_demo_decides_every_job_learns_from_retries_and_serves_the_promoted_model(
        ) -> None:
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
    # The scheduler's retries vote; each label shows the retry outcome's vote.
    labels = [line for line in done.stdout.splitlines() if line.startswith("label  demo-")]
    assert labels and all("outcome=" in line for line in labels), done.stdout
    # The trainer's candidate with both models' scores, promoted through the gate...
    assert re.search(r"^candidate \S+ .*: PROMOTED$", done.stdout, re.M), done.stdout
    assert re.search(r"^  candidate real: accuracy \d\.\d{3}", done.stdout, re.M), done.stdout
    promoted = re.search(r"^promoted and announced on \S+: (\S+) ", done.stdout, re.M)
    assert promoted, done.stdout
    # ... and the worker's next decision carries its version.
    assert f"model_version={promoted.group(1)}" in done.stdout, done.stdout
