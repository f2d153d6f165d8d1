"""README's first command: ``sibylla demo`` on the embedded broker, from nothing: decisions,
labels from retry outcomes, a gated promotion and a decision by the promoted model."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.integration.fixtures import make_settings, read_all

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


def test_on_an_existing_cluster_the_demo_keeps_to_topics_and_a_group_of_its_own(
        broker: Any, unique_prefix: str, tmp_path: Path) -> None:
    """Pointed at a real cluster, the demo must not reach its users: no decisions for the
    schedulers, no model announcement for the workers, no member in their consumer group."""
    env = {k: v for k, v in os.environ.items() if k != "SIBYLLA_BOOTSTRAP_SERVERS"}
    done = subprocess.run(
        [sys.executable, "-m", "sibylla", "demo", "--timeout", "150",
         "--bootstrap-servers", broker.bootstrap_servers, "--topic-prefix", unique_prefix,
         "--group-id", unique_prefix + "workers", "--partitions", "4"],
        capture_output=True, text=True, timeout=240, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    own = re.search(r"topics (\S+)\* and consumer group (\S+) of the demo's own", done.stderr)
    assert own, done.stderr
    assert own.group(1).startswith(unique_prefix.rstrip(".") + "-demo-")
    assert own.group(2).startswith(unique_prefix + "workers-demo-")
    cluster = make_settings(broker.bootstrap_servers, unique_prefix, tmp_path)
    demo = dataclasses.replace(cluster, topic_prefix=own.group(1))
    assert asyncio.run(read_all(cluster, "decisions")) == []
    assert asyncio.run(read_all(cluster, "models")) == []
    assert len(asyncio.run(read_all(demo, "decisions"))) >= 15
    assert asyncio.run(read_all(demo, "models"))
