"""The alert rules operators load are valid, and each one is shown firing and staying quiet by
``promtool test rules`` (Prometheus's own rule engine, on synthetic series)."""

from __future__ import annotations

import shutil
import subprocess
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import generate_latest

from sibylla.online_learning.gate import Scores
from sibylla.online_learning.metrics import TrainerMetrics
from sibylla.scheduler.metrics import ActuatorMetrics

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy/prometheus/alerts.yml"
RULE_TESTS = ROOT / "deploy/prometheus/alerts.test.yml"

needs_promtool = pytest.mark.skipif(
    shutil.which("promtool") is None,
    reason="promtool not installed (Debian package prometheus; .ci/run installs it)")


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["promtool", *args], cwd=RULES.parent, capture_output=True,
                          text=True, timeout=120)


@needs_promtool
def test_promtool_accepts_the_rules() -> None:
    result = _promtool("check", "rules", RULES.name)
    assert result.returncode == 0, result.stdout + result.stderr


@needs_promtool
def test_every_alert_fires_and_stays_quiet_in_promtool_unit_tests() -> None:
    result = _promtool("test", "rules", RULE_TESTS.name)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout + result.stderr


def test_every_alert_has_a_firing_and_a_quiet_case() -> None:
    alerts = {rule["alert"] for group in yaml.safe_load(RULES.read_text())["groups"]
              for rule in group["rules"] if "alert" in rule}
    cases: dict[str, set[bool]] = defaultdict(set)
    for test in yaml.safe_load(RULE_TESTS.read_text())["tests"]:
        for check in test.get("alert_rule_test", []):
            cases[check["alertname"]].add(bool(check.get("exp_alerts")))
    assert alerts, "no alert rules"
    for alert in sorted(alerts):
        assert cases[alert] == {True, False}, f"{alert}: needs a firing and a quiet test case"


def _compose_prometheus() -> tuple[dict[str, Any], dict[str, Path]]:
    """deploy/prometheus.yml, and what compose mounts into its container (target -> source)."""
    config = yaml.safe_load((ROOT / "deploy/prometheus.yml").read_text())
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    mounts = {}
    for volume in compose["services"]["prometheus"]["volumes"]:
        source, target = volume.split(":")[:2]
        mounts[target] = (ROOT / source).resolve()
    return config, mounts


def test_compose_prometheus_mounts_every_rule_file_it_loads() -> None:
    config, mounts = _compose_prometheus()
    assert config["rule_files"], "Prometheus in docker compose loads no alert rules"
    for rule_file in config["rule_files"]:
        assert rule_file in mounts, f"{rule_file} is not mounted into the prometheus service"
        assert mounts[rule_file] == RULES.resolve()


@needs_promtool
def test_promtool_accepts_the_compose_prometheus_config(tmp_path: Path) -> None:
    """The config as the container sees it: rule files at their mounted paths."""
    config, mounts = _compose_prometheus()
    config["rule_files"] = [str(mounts[f]) for f in config["rule_files"]]
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    result = subprocess.run(["promtool", "check", "config", str(path)], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


@needs_promtool
def test_promtool_accepts_the_trainers_metric_names() -> None:
    """The worker's exposition is linted live (tests/integration/test_operators.py); the
    trainer's, with every series set, here."""
    metrics = TrainerMetrics()
    metrics.labels.labels(use="new").inc()
    metrics.candidates.labels(result="promoted").inc()
    metrics.set_scores("candidate", {"real": Scores(46, 0.95, 0.93, 15, 1.0)})
    metrics.set_model("lstm-1")
    metrics.drift.set(0.1)
    metrics.finetune_seconds.set(12.0)
    result = subprocess.run(["promtool", "check", "metrics"],
                            input=generate_latest(metrics.registry).decode(),
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


@needs_promtool
def test_promtool_accepts_the_slurm_actuators_metric_names() -> None:
    metrics = ActuatorMetrics()
    metrics.handled("retry", "applied")
    metrics.set_lag({0: 3})
    metrics.waiting_since = 0.0
    result = subprocess.run(["promtool", "check", "metrics"],
                            input=generate_latest(metrics.registry).decode(),
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
