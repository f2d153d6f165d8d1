"""A real Prometheus (Debian's ``prometheus`` 2.42 binary) for the integration tests: a plain
process under a temp dir, scraping a worker every second and loading Sibylla's alert rules."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from sibylla.brokers.process import die_with_parent, free_port, stop_process_group

__all__ = ["ALERT_RULES", "PrometheusProcess", "dashboard_queries", "prometheus_missing"]

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
ALERT_RULES = DEPLOY / "prometheus" / "alerts.yml"
DASHBOARD = DEPLOY / "grafana" / "dashboards" / "sibylla.json"


def dashboard_queries(actuator: bool) -> list[tuple[str, str]]:
    """The Grafana dashboard's queries, as (panel title, expression): those of the Slurm
    actuator's series when ``actuator``, the workers' otherwise (each asked of a live one)."""
    dashboard = json.loads(DASHBOARD.read_text())
    return [(panel["title"], target["expr"]) for panel in dashboard["panels"]
            for target in panel["targets"]
            if ("sibylla_actuator_" in target["expr"]) == actuator]


def prometheus_missing() -> str | None:
    """Why the Prometheus tests cannot run here, or None when they can."""
    if shutil.which("prometheus") is None or shutil.which("promtool") is None:
        return "prometheus/promtool not installed (Debian package prometheus; .ci/run installs it)"
    return None


class PrometheusProcess:
    """``prometheus`` scraping ``targets`` (host:port) at 1 s, with the alert rules loaded."""

    def __init__(self, workdir: Path, targets: list[str]) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(ALERT_RULES)],
            "scrape_configs": [{"job_name": "sibylla",
                                "static_configs": [{"targets": targets}]}],
        }
        workdir.mkdir(parents=True, exist_ok=True)
        self.config_path = workdir / "prometheus.yml"
        self.config_path.write_text(yaml.safe_dump(config))
        self.log_path = workdir / "prometheus.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 60.0) -> PrometheusProcess:
        with open(self.log_path, "ab") as out:
            self.proc = subprocess.Popen(
                ["prometheus", f"--config.file={self.config_path}",
                 f"--storage.tsdb.path={self.workdir / 'data'}",
                 f"--web.listen-address=127.0.0.1:{self.port}"],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True, preexec_fn=die_with_parent, cwd=self.workdir)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"prometheus exited with {self.proc.returncode}:\n"
                                   f"{self.tail()}")
            try:
                with urllib.request.urlopen(f"{self.base}/-/ready", timeout=2) as resp:
                    if resp.status == 200:
                        return self
            except OSError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"prometheus not ready within {timeout_s:.0f}s:\n{self.tail()}")

    def api(self, path: str, **params: str) -> Any:
        """The ``data`` of a successful API answer (an error answer raises)."""
        url = f"{self.base}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(url, timeout=10) as resp:
                body = json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            raise AssertionError(f"{url}: {exc.code} {exc.read().decode()}") from None
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query's vector (a list of {metric, value})."""
        data = self.api("query", query=expr)
        assert data["resultType"] == "vector", (expr, data)
        return list(data["result"])

    def wait_for(self, expr: str, timeout_s: float = 30.0) -> list[dict[str, Any]]:
        """The query's result once it is not empty (Prometheus scrapes every second)."""
        deadline = time.monotonic() + timeout_s
        while True:
            result = self.query(expr)
            if result or time.monotonic() > deadline:
                return result
            time.sleep(0.5)

    def without_data(self, queries: list[tuple[str, str]]) -> list[str]:
        """``title: expression`` of each query that still returns nothing after a wait."""
        return [f"{title}: {expr}" for title, expr in queries if not self.wait_for(expr)]

    def tail(self, chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def stop(self) -> None:
        if self.proc is not None:
            stop_process_group(self.proc, 15.0)
