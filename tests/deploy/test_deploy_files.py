"""The files users deploy with are well-formed and complete."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

from sibylla.online_learning.metrics import VoteMetrics
from sibylla.scheduler.metrics import ActuatorMetrics
from sibylla.streams.metrics import WorkerMetrics

ROOT = Path(__file__).resolve().parents[2]


def test_compose_parses_and_every_mounted_file_exists() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    assert {"kafka", "worker", "prometheus", "grafana"} <= set(compose["services"])
    for name, service in compose["services"].items():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("."):
                assert (ROOT / source).exists(), f"{name} mounts missing {source}"
        build = service.get("build")
        if build:
            assert (ROOT / build["context"] / build["dockerfile"]).is_file()


def test_the_dashboard_only_charts_metrics_the_worker_or_the_actuator_exports() -> None:
    dashboard = json.loads((ROOT / "deploy/grafana/dashboards/sibylla.json").read_text())
    worker = WorkerMetrics()
    VoteMetrics(worker.registry)  # the online-learning agents a worker registers
    exported = {m.name for registry in (worker.registry, ActuatorMetrics().registry)
                for m in registry.collect()}
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            for name in re.findall(r"sibylla_[a-z_]+", target["expr"]):
                base = re.sub(r"_(total|bucket|sum|count)$", "", name)
                assert base in exported, f"{panel['title']} charts unknown metric {name}"
