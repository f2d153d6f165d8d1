"""What an operator sees, checked with the real tools: a real Prometheus scraping a running
worker (series, promtool's lint, the Grafana dashboard's queries, the alert rules evaluated on
live series) and the status page rendered by headless Chromium.

One worker and one Prometheus serve the whole module: the fixture makes the worker decide a
few jobs (every action), reject bad records, take an operator label and two model
announcements (its own model with gate scores, then one whose file is missing), so that every
series the dashboard and the alerts read exists.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
import time
import urllib.request
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from sibylla.online_learning.announce import announcement
from sibylla.online_learning.signing import generate_key_pair, load_private_key
from sibylla.schemas.records import Decision, JobEvent
from sibylla.settings import Settings
from sibylla.streams.launch import WorkerProcess
from sibylla.streams.ship import Shipper
from tests.integration.fixtures import (
    DETERMINISTIC_LOG,
    NONDETERMINISTIC_LOG,
    collect_decisions,
    make_settings,
    only_brokers,
    ship_job,
    start_worker,
)
from tests.integration.prometheus import (
    PrometheusProcess,
    dashboard_queries,
    prometheus_missing,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
# A log line is attacker-controlled: the status page must show it as text, never run it.
HOSTILE_LINE = "RuntimeError: <script>document.title='owned'</script><img src=x onerror=alert(1)>"
FAILED_JOBS = {
    "job-shape": (DETERMINISTIC_LOG + "\n" + HOSTILE_LINE, "FAILED", ("gpu-a01",)),
    "job-nccl": (NONDETERMINISTIC_LOG, "FAILED", ("gpu-b07", "gpu-b08")),
    "job-node": (NONDETERMINISTIC_LOG, "NODE_FAIL", ("gpu-c01", "gpu-c02")),
    "job-silent": (None, "FAILED", ("gpu-d01",)),  # nothing printed: default_policy
}
GATE_SCORES = {"candidate": {"real": {"accuracy": 0.957, "det_precision": 0.933}}}


@dataclass
class Live:
    settings: Settings
    worker: WorkerProcess
    decisions: dict[str, Decision]
    model_version: str

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.worker.settings.web_port}"


OPERATOR_TOKEN = "ops-token-0123456789abcdef"


def _post(url: str, body: dict[str, Any]) -> int:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json",
                                              "Authorization": f"Bearer {OPERATOR_TOKEN}"})
    with urllib.request.urlopen(request, timeout=10) as resp:
        return int(resp.status)


async def _scenario(settings: Settings, model_version: str, workdir: Path
                    ) -> dict[str, Decision]:
    """Failed jobs, a completed one, bad records, and the two model announcements."""
    now = time.time()
    async with Shipper(settings) as shipper:
        # An hour of exposure on two nodes before a node failure: the worker estimates r_f.
        await shipper.send_event(JobEvent("job-node", 0, "started", nodes=("gpu-c01", "gpu-c02"),
                                          gpus=16, ts=now - 3600))
        for job_id, (log, state, nodes) in FAILED_JOBS.items():
            await ship_job(shipper, job_id, log, state, nodes)
        await ship_job(shipper, "job-ok", "epoch 9 done\nsaved checkpoint", "COMPLETED")
        await shipper.send_lines("job-running", ["epoch 1 step 10 loss 2.31"])  # still running
        await shipper.send_raw(settings.topic("logs"), b"broken", b'{"job_id": "broken", "line": ')
        await shipper.send_raw(settings.topic("job-events"), b"j5", b'{"job_id": "j5"}')
        # The model in use, announced with its gate scores (the status page shows them) ...
        key = load_private_key(workdir / "trainer.key")
        own = announcement("sibylla-classifier", model_version, workdir / "own.safetensors",
                           "0" * 64, GATE_SCORES, 1, key)
        # ... then one the worker cannot load (its file does not exist): announced, not loaded.
        missing = announcement("sibylla-classifier", "lstm-missing",
                               workdir / "missing.safetensors", "0" * 64, {}, 2, key)
        for ann in (own, missing):
            await shipper.send_raw(settings.topic("models"), b"sibylla-classifier",
                                   ann.to_json())
        await shipper.flush()
    found = await collect_decisions(settings, set(FAILED_JOBS), timeout_s=120)
    return {d.job_id: d for d in found}


@pytest.fixture(scope="module")
def live(broker: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    """A worker that has decided the jobs of :func:`_scenario`."""
    workdir = tmp_path_factory.mktemp("operators")
    settings = make_settings(broker.bootstrap_servers, f"t{uuid.uuid4().hex[:10]}.", workdir)
    # Signed announcements and an operator token, as a secured deployment runs.
    _, public_key = generate_key_pair(workdir / "trainer.key")
    tokens = workdir / "operators"
    tokens.write_text(f"ops:{OPERATOR_TOKEN}\n")
    tokens.chmod(0o600)
    security = {"SIBYLLA_MODEL_PUBLIC_KEY": public_key, "SIBYLLA_MODEL_ROOTS": str(workdir),
                "SIBYLLA_OPERATOR_TOKENS_FILE": str(tokens)}
    with start_worker(settings, workdir, extra_env=security) as worker:
        # The model loads while the worker joins its group: it is named once loaded, with
        # where it runs (the tests' workers: SIBYLLA_DEVICE=cpu, make_settings).
        deadline = time.monotonic() + 60
        while (version := re.search(r'sibylla_model_info\{device="cpu",version="([^"]+)"\}',
                                    text := worker.metrics_text())) is None:
            assert time.monotonic() < deadline, text
            time.sleep(0.2)
        decisions = asyncio.run(_scenario(settings, version.group(1), workdir))
        assert set(decisions) == set(FAILED_JOBS), worker.tail()
        base = f"http://127.0.0.1:{worker.settings.web_port}"
        assert _post(f"{base}/labels/job-shape/0", {"label": "deterministic"}) == 202
        yield Live(settings, worker, decisions, version.group(1))


@pytest.fixture(scope="module")
def prom(live: Live, tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrometheusProcess]:
    """Prometheus scraping the live worker every second, with the alert rules loaded."""
    if (why := prometheus_missing()) is not None:
        pytest.skip(why)
    target = f"127.0.0.1:{live.worker.settings.web_port}"
    prometheus = PrometheusProcess(tmp_path_factory.mktemp("prometheus"), [target]).start()
    yield prometheus
    prometheus.stop()


def _value(sample: dict[str, Any]) -> float:
    return float(sample["value"][1])


def _by(result: list[dict[str, Any]], label: str) -> dict[str, float]:
    return {s["metric"].get(label, ""): _value(s) for s in result}


@only_brokers("tansu")
def test_prometheus_scrapes_the_series_an_operator_needs(live: Live, prom: PrometheusProcess
                                                        ) -> None:
    decisions = live.decisions
    logs = live.settings.topic("logs")
    lag = prom.wait_for(f'sibylla_consumer_lag{{topic="{logs}"}}')
    assert sorted(s["metric"]["partition"] for s in lag) == ["0", "1", "2", "3"]

    lines = sum(len(log.splitlines()) for log, _, _ in FAILED_JOBS.values() if log) + 2 + 1
    records = sum(1 for log, _, _ in FAILED_JOBS.values() if log) + 2  # one batch per job
    assert _value(prom.wait_for(f"sibylla_log_lines_ingested_total == {lines}")[0]) == lines
    assert _value(prom.wait_for(f"sibylla_log_records_ingested_total == {records}")[0]) == records

    letters = _by(prom.wait_for("sum by (reason) (sibylla_dead_letters_total)"), "reason")
    assert letters == {"invalid_json": 1, "invalid_field": 1, "not_an_object": 0,
                       "missing_job_id": 0, "too_long": 0}  # every class, 0 until it happens

    want = Counter((d.verdict, d.action) for d in decisions.values())
    got = prom.wait_for(f"sibylla_decisions_total >= 0 and on() "
                        f"sum(sibylla_decisions_total) == {len(decisions)}")
    assert {(s["metric"]["verdict"], s["metric"]["action"]): _value(s) for s in got} == want
    assert {a for _, a in want} >= {"do_not_retry", "retry_elsewhere", "default_policy"}
    count = prom.query("sibylla_decision_latency_seconds_count")
    assert [_value(s) for s in count] == [len(decisions)]
    buckets = prom.query("sibylla_decision_latency_seconds_bucket")
    assert len(buckets) > 5 and max(_value(s) for s in buckets) == len(decisions)
    # Where each decision's time went, by stage: the stages add up to its latency (the
    # decision is stamped after the model answered, before the broker acknowledged it).
    stages = _by(prom.query("sibylla_decision_stage_seconds_sum"), "stage")
    assert _by(prom.query("sibylla_decision_stage_seconds_count"), "stage") == {
        "waiting": len(decisions), "classifying": len(decisions), "publishing": len(decisions)}
    latency = _value(prom.query("sibylla_decision_latency_seconds_sum")[0])
    slack = 0.001 * len(decisions)
    assert stages["waiting"] + stages["classifying"] - slack <= latency
    assert latency <= sum(stages.values()) + slack

    assert _by(prom.query("sibylla_model_info"), "version") == {live.model_version: 1}
    assert _by(prom.wait_for('sibylla_model_announced_info{version="lstm-missing"}'),
               "version") == {"lstm-missing": 1}
    assert _value(prom.query("sibylla_model_announcements_rejected_total")[0]) == 1
    # job-running's window; job-ok's too when its lines were taken after its COMPLETED event
    # had released the window (they then wait for the idle TTL). Decided attempts' windows
    # are freed a few seconds after their decisions (agents.RELEASE_AFTER_S).
    assert _value(prom.wait_for("sibylla_active_windows <= 2")[0]) in (1, 2)
    assert _value(prom.wait_for("sibylla_worker_ready == 1")[0]) == 1


@only_brokers("tansu")
def test_promtool_accepts_the_worker_exposition(live: Live) -> None:
    if (why := prometheus_missing()) is not None:
        pytest.skip(why)
    text = live.worker.metrics_text()
    assert "sibylla_dead_letters_total" in text and "sibylla_worker_ready 1.0" in text
    result = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


@only_brokers("tansu")
def test_every_grafana_query_returns_data_from_a_live_worker(prom: PrometheusProcess) -> None:
    queries = dashboard_queries(actuator=False)
    assert len(queries) >= 10
    # rate() needs two samples of a counter after it moved: wait for the labels to be counted.
    prom.wait_for("sibylla_labels_published_total")
    time.sleep(3)
    empty = prom.without_data(queries)
    assert not empty, "queries without data:\n" + "\n".join(empty)


@only_brokers("tansu")
def test_the_alert_rules_evaluate_on_live_series(prom: PrometheusProcess) -> None:
    groups = prom.api("rules")["groups"]
    rules = {r["name"]: r for g in groups for r in g["rules"]}
    assert {"SibyllaWorkerNotReady", "SibyllaModelAnnouncedNotLoaded"} <= set(rules)
    assert all(r["health"] == "ok" for r in rules.values()), rules
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        active = {a["labels"]["alertname"]: a for a in prom.api("alerts")["alerts"]}
        if "SibyllaModelAnnouncedNotLoaded" in active:
            break
        time.sleep(0.5)
    alert = active["SibyllaModelAnnouncedNotLoaded"]
    assert alert["state"] == "pending"  # it fires after 5 minutes of this
    assert alert["labels"]["version"] == "lstm-missing"
    assert "SibyllaWorkerNotReady" not in active
    assert "SibyllaWorkerDown" not in active


@only_brokers("tansu")
def test_ready_answers_200_with_the_partitions(live: Live) -> None:
    with urllib.request.urlopen(f"{live.base}/ready", timeout=10) as resp:
        assert resp.status == 200
        body = json.loads(resp.read())
    assert body["ready"] is True and body["partitions"] == [0, 1, 2, 3]
    assert body["ready_after_s"] > 0


def _chromium(*args: str, timeout_s: float = 90.0) -> subprocess.CompletedProcess[str]:
    binary = shutil.which("chromium")
    assert binary
    return subprocess.run([binary, "--headless", "--no-sandbox", "--disable-gpu",
                           "--disable-quic", "--no-first-run", "--disable-background-networking",
                           "--disable-component-update", "--disable-sync", *args],
                          capture_output=True, text=True, timeout=timeout_s)


@only_brokers("tansu")
def test_the_status_page_renders_the_figures_in_chromium(live: Live, tmp_path: Path) -> None:
    if shutil.which("chromium") is None:
        pytest.skip("chromium not installed (Debian package chromium; .ci/run installs it)")
    deadline = time.monotonic() + 30  # until the worker has measured its lag
    while "sibylla_consumer_lag{" not in live.worker.metrics_text():
        assert time.monotonic() < deadline, live.worker.tail()
        time.sleep(0.5)
    url = f"{live.base}/"
    dom = _chromium(f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom", url)
    assert dom.returncode == 0, dom.stderr[-3000:]
    page = dom.stdout
    assert f'<b id="model-version">{live.model_version}</b> on <b id="model-device">cpu</b>' in page
    assert "det_precision 0.933" in page  # the gate scores it was announced with
    assert '<b class="ok" id="ready">ready</b>' in page
    for job_id, decision in live.decisions.items():
        row = re.search(rf'<span class="job-id">{job_id}</span>.*?</tr>', page, re.S)
        assert row, f"{job_id} not on the page"
        assert f'<b class="action">{decision.action}</b>' in row.group(0)
    assert "<td>gpu-c01</td>" in page.split("Suspect nodes")[1]  # sent elsewhere (NODE_FAIL)
    assert "invalid_json 1" in page
    logs = re.escape(live.settings.topic("logs"))
    assert re.search(rf"<tr><td>{logs}</td>(<td>[\d,]+</td>){{4}}</tr>", page)  # lag of 4
    # The hostile log line is shown as text: no element came out of it.
    assert "&lt;script&gt;document.title='owned'&lt;/script&gt;" in page
    assert "<script" not in page and "<img" not in page

    shot = tmp_path / "status-page.png"
    result = _chromium(f"--user-data-dir={tmp_path / 'profile-shot'}", "--hide-scrollbars",
                       "--window-size=1280,1450", f"--screenshot={shot}", url)
    assert result.returncode == 0, result.stderr[-3000:]
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000
    if target := os.environ.get("SIBYLLA_STATUS_SCREENSHOT"):  # how docs/img/ gets its copy
        shutil.copyfile(shot, target)
