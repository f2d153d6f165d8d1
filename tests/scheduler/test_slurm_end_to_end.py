"""The loop closed on a real Slurm cluster: slurmctld's epilog publishes each attempt, a real
worker decides with the shipped model, and the actuator requeues, excludes nodes or leaves the
job failed. Skipped only where Slurm's binaries are missing (``.ci/run`` installs them)."""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import dataclasses
import functools
import io
import os
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaConsumer
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from sibylla.scheduler import actuator as actuator_module
from sibylla.scheduler.actuator import Actuator, run_actuator
from sibylla.scheduler.scontrol import Scontrol
from sibylla.schemas.records import Decision, parse_log_record
from sibylla.settings import Settings
from sibylla.streams.ship import Shipper
from sibylla.streams.topics import ensure_topics
from tests.integration.fixtures import (
    NONDETERMINISTIC_LOG,
    make_settings,
    read_all,
    start_worker,
)
from tests.integration.prometheus import (
    PrometheusProcess,
    dashboard_queries,
    prometheus_missing,
)
from tests.scheduler.slurm_cluster import SlurmCluster, missing_binaries

pytestmark = [
    pytest.mark.integration, pytest.mark.slow,
    pytest.mark.skipif(bool(missing_binaries()),
                       reason="Slurm is not installed (apt-get install slurm-wlm munge; "
                              f"missing: {', '.join(missing_binaries())})"),
]

IMPORT_ERROR_LOG = """\
2026-11-30 10:00:01,123 INFO Starting training: model=resnet50 world_size=1 batch_size=256
Traceback (most recent call last):
  File "/home/alice/project/train.py", line 12, in <module>
    from apex import amp
ModuleNotFoundError: No module named 'apex'"""

PROGRESS_LOG = """\
2026-11-30 10:00:01,123 INFO Starting training: model=gpt-small world_size=1 batch_size=32
Epoch 1: 10%|█         | 100/1000 [01:01<09:18, 1.6s/it, loss=3.02]"""


def _print(text: str) -> str:
    return "cat <<'EOF'\n" + text + "\nEOF\n"


def _fails_once(marker: Path, first: str, then: str) -> str:
    """A job script that runs the shell lines ``first`` and fails on its first run, and on
    later runs ``then`` and succeeds (the marker file remembers the first run)."""
    return f"if [ ! -e {marker} ]; then\n  touch {marker}\n{first}  exit 1\nfi\n{then}"


def _retry(job_id: str) -> Decision:
    """A worker's retry decision on attempt 0 of a failed job (an NCCL timeout), made now."""
    return Decision(job_id, 0, "nondeterministic", 0.99, "collective_timeout", "retry", [], [],
                    "m", time.time(), 1.0, state="FAILED")


def _elsewhere(job_id: str, node: str) -> Decision:
    """A worker's decision to run attempt 0's failed job again away from ``node``."""
    return Decision(job_id, 0, "nondeterministic", 0.99, "gpu_hardware", "retry_elsewhere",
                    [node], [], "m", time.time(), 1.0, state="FAILED", exclude_nodes=[node])

def _finished(job: dict[str, str]) -> bool:
    return job["JobState"] in ("COMPLETED", "FAILED")


class ActuatorProcess:
    """``sibylla slurm actuator`` as a child process with its audit file."""

    def __init__(self, settings: Settings, cluster: SlurmCluster, audit: Path) -> None:
        self.audit = audit
        self.metrics_url = f"http://127.0.0.1:{settings.slurm_actuator_metrics_port}/metrics"
        env = {**os.environ, **settings.to_env(), "SLURM_CONF": str(cluster.conf),
               "SIBYLLA_SLURM_AUDIT_FILE": str(audit)}
        self.log = open(audit.with_suffix(".log"), "ab")  # noqa: SIM115
        self.proc = subprocess.Popen([sys.executable, "-m", "sibylla", "slurm", "actuator"],
                                     stdout=self.log, stderr=subprocess.STDOUT, env=env,
                                     stdin=subprocess.DEVNULL)

    def _samples(self, family: str) -> list[Sample]:
        """The samples of one metric family on the actuator's /metrics."""
        text = urllib.request.urlopen(self.metrics_url, timeout=5).read().decode()
        return [s for f in text_string_to_metric_families(text) if f.name == family
                for s in f.samples]

    def handled(self) -> dict[tuple[str, str], float]:
        """Decisions handled by (action, outcome); only those with any."""
        return {(s.labels["action"], s.labels["outcome"]): s.value
                for s in self._samples("sibylla_actuator_decisions")
                if s.name.endswith("_total") and s.value}

    def lag(self) -> dict[str, float]:
        """Decisions on the topic the actuator has not handled, by partition."""
        return {s.labels["partition"]: s.value for s in self._samples("sibylla_actuator_lag")}

    def lines(self) -> list[dict[str, object]]:
        if not self.audit.exists():
            return []
        return [orjson.loads(line) for line in self.audit.read_bytes().splitlines()]

    def wait_lines(self, count: int, timeout_s: float = 60.0) -> list[dict[str, object]]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and len(self.lines()) < count:
            time.sleep(0.3)
        return self.lines()

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


@pytest.fixture(scope="session")
def cluster() -> Iterator[SlurmCluster]:
    slurm = SlurmCluster().start()
    try:
        yield slurm
    finally:
        slurm.stop()


def _decisions(settings: Settings) -> dict[tuple[str, int], Decision]:
    records = asyncio.run(read_all(settings, "decisions", idle_s=2.0))
    return {(r["job_id"], r["attempt"]): Decision.from_json(orjson.dumps(r)) for r in records}


def _diagnosis(decided: dict[tuple[str, int], Decision], cluster: SlurmCluster,
               worker_log: Path) -> str:
    rows = [f"{job} #{attempt}: {d.action} {d.rule} {d.category} lines={d.line_count} "
            f"recurrence={d.recurrence} latency={d.latency_ms:.0f} ms"
            for (job, attempt), d in sorted(decided.items())]
    warnings = [line for line in worker_log.read_text(errors="replace").splitlines()
                if " WARNING " in line or " ERROR " in line]
    return "\n".join(["decisions:", *rows, "worker warnings:", *warnings[-40:], cluster.logs()])


def test_slurm_jobs_are_stopped_requeued_or_sent_elsewhere_by_their_decisions(
        broker: object, cluster: SlurmCluster, unique_prefix: str, workdir: Path) -> None:
    # The production grace period, not the tests' 0.5 s: a job requeued at once can end again
    # within a second, and on Tansu the decision's wait for ingest to catch up trusts an end
    # offset Tansu reports short (docs/brokers.md), while faust's fetch may hold new records
    # up to 1.5 s: with 0.5 s, one run decided an attempt before its shipped lines arrived.
    settings = make_settings(broker.bootstrap_servers, unique_prefix,  # type: ignore[attr-defined]
                             workdir, slurm_epilog_state_dir=cluster.root / "epilog-state",
                             grace_period_s=2.0)
    cluster.configure_epilog(settings.to_env())
    worker = start_worker(settings, workdir)
    actuator = ActuatorProcess(settings, cluster, workdir / "audit.jsonl")
    try:
        marks = cluster.root / "marks" / unique_prefix  # the cluster outlives the test
        marks.mkdir(parents=True)
        imp = cluster.sbatch(_print(IMPORT_ERROR_LOG) + "exit 1\n", "imp")
        nccl = cluster.sbatch(_fails_once(marks / "nccl", _print(NONDETERMINISTIC_LOG),
                                          "echo 'training finished, final loss=1.91'\n"),
                              "nccl")
        same = cluster.sbatch(_print(NONDETERMINISTIC_LOG) + "exit 1\n", "same")

        # An import error is deterministic: the job stays failed after its first attempt.
        job = cluster.wait_job(imp, lambda j: j["JobState"] == "FAILED")
        # A transient NCCL failure is requeued and completes on its second attempt.
        job = cluster.wait_job(nccl, lambda j: j["JobState"] == "COMPLETED")
        assert job["Restarts"] == "1"
        # The same transient-looking root recurring without progress stops the job (on its
        # third attempt: policy_max_recurrence_transient).
        job = cluster.wait_job(same, lambda j: _finished(j) and j["Restarts"] == "2")
        assert job["JobState"] == "FAILED"

        # A node failure: the job is requeued with the failed node excluded and completes on
        # the other node.
        node = cluster.sbatch(_fails_once(marks / "node", _print(PROGRESS_LOG) + "sleep 300\n",
                                          "echo 'resumed from checkpoint, done'\n"), "node")
        job = cluster.wait_job(node, lambda j: j["JobState"] == "RUNNING")
        output = cluster.root / "out" / f"node-{node}.out"
        deadline = time.monotonic() + 60  # the first run has marked itself and printed
        while "Epoch 1" not in (output.read_text() if output.exists() else ""):
            assert time.monotonic() < deadline, cluster.logs()
            time.sleep(0.2)
        failed_node = job["NodeList"]
        cluster.scontrol.run(["update", f"nodename={failed_node}", "state=down",
                              "reason=sibylla-test"])
        job = cluster.wait_job(node, lambda j: j["JobState"] == "COMPLETED")
        assert job["Restarts"] == "1"
        assert job["ExcNodeList"] == failed_node
        assert job["NodeList"] != failed_node

        decided = _decisions(settings)
        # On a failure: every decision, what the epilog shipped per attempt, the worker's
        # warnings (a decision on lines it never got shows there or in the epilog's counts).
        why = _diagnosis(decided, cluster, workdir / "worker.log")
        assert decided[(imp, 0)].action == "do_not_retry", why
        assert decided[(imp, 0)].category == "import_error", why
        assert decided[(nccl, 0)].action in ("retry", "retry_elsewhere"), why
        assert decided[(same, 0)].action in ("retry", "retry_elsewhere"), why
        assert decided[(same, 1)].action in ("retry", "retry_elsewhere"), why
        last = decided[(same, 2)]
        assert (last.action, last.rule, last.recurrence, last.progressed) == (
            "do_not_retry", "same_root_recurred", 3, False), why
        assert last.fingerprint == decided[(same, 0)].fingerprint, why
        node_decision = decided[(node, 0)]
        assert (node_decision.state, node_decision.action, node_decision.rule) == (
            "NODE_FAIL", "retry_elsewhere", "not_job_fault")
        assert node_decision.exclude_nodes == [failed_node]
        assert (nccl, 1) not in decided  # a completed attempt needs no decision

        audited = actuator.wait_lines(len(decided))
        applied = {(a["job_id"], a["attempt"]): a for a in audited}
        assert applied[(imp, 0)]["outcome"] == "skipped"
        assert applied[(nccl, 0)]["outcome"] == "applied"
        assert applied[(same, 2)]["outcome"] == "skipped"
        assert applied[(node, 0)]["commands"][0][1] == "update"  # slurmctld requeued it
        # What an operator's Prometheus sees: every decision handled, by its outcome, and
        # none left behind.
        assert actuator.handled() == collections.Counter(
            (a["action"], a["outcome"]) for a in audited)
        deadline = time.monotonic() + 10
        while any(actuator.lag().values()) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert actuator.lag() == {str(p): 0 for p in range(settings.partitions)}

        # The failed node is blamed: in the worker's metric and in `sibylla nodes`.
        assert (f'sibylla_node_blames_total{{node="{failed_node}"}} 1.0'
                in worker.metrics_text())
        listed = subprocess.run([sys.executable, "-m", "sibylla", "nodes", "--all", "--json"],
                                env={**os.environ, **settings.to_env()}, capture_output=True,
                                check=True).stdout
        rows = [orjson.loads(line) for line in listed.splitlines()]
        assert [(r["node"], r["jobs"], r["suspect"]) for r in rows] == [(failed_node, 1, False)]
    finally:
        actuator.stop()
        worker.stop()
        cluster.resume_nodes()

    # A restarted actuator with a fresh group replays every decision and changes nothing.
    replay_settings = make_settings(broker.bootstrap_servers,  # type: ignore[attr-defined]
                                    unique_prefix, workdir,
                                    slurm_actuator_group=unique_prefix + "replay")
    replay = ActuatorProcess(replay_settings, cluster, workdir / "replay.jsonl")
    try:
        lines = replay.wait_lines(len(decided))
    finally:
        replay.stop()
    assert len(lines) == len(decided)
    assert {line["outcome"] for line in lines} == {"skipped"}
    assert cluster.job(nccl)["Restarts"] == "1"


def test_the_actuator_in_dry_run_changes_nothing_and_a_replay_acts_once(
        cluster: SlurmCluster, tmp_path: Path) -> None:
    cluster.configure_epilog({})  # no broker: the epilog fails fast, the job is untouched
    job_id = cluster.sbatch(_print(NONDETERMINISTIC_LOG) + "exit 1\n", "dry")
    cluster.wait_job(job_id, lambda j: j["JobState"] == "FAILED")
    decision = _retry(job_id)
    audit = io.BytesIO()
    base = Settings.from_env({}, slurm_mode="dry-run")
    scontrol = cluster.scontrol

    record = Actuator(base, scontrol, audit).apply(decision)
    assert record["outcome"] == "dry-run"
    assert record["commands"][0] == ["scontrol", "requeue", job_id]
    assert cluster.job(job_id)["Restarts"] == "0"

    applying = Actuator(dataclasses.replace(base, slurm_mode="apply"), scontrol, audit)
    assert applying.apply(decision)["outcome"] == "applied"
    assert applying.apply(decision)["outcome"] == "skipped"  # replayed: nothing twice
    assert cluster.job(job_id)["Restarts"] == "1"
    assert [orjson.loads(line)["outcome"] for line in audit.getvalue().splitlines()] == [
        "dry-run", "applied", "skipped"]
    cluster.wait_job(job_id, lambda j: j["JobState"] == "FAILED" and j["Restarts"] == "1")


def test_do_not_retry_can_hold_the_job_for_a_human(cluster: SlurmCluster) -> None:
    cluster.configure_epilog({})
    job_id = cluster.sbatch(_print(IMPORT_ERROR_LOG) + "exit 1\n", "held")
    cluster.wait_job(job_id, lambda j: j["JobState"] == "FAILED")
    decision = Decision(job_id, 0, "deterministic", 0.99, "import_error", "do_not_retry", [],
                        [], "m", time.time(), 1.0, state="FAILED")
    settings = Settings.from_env({}, slurm_do_not_retry="requeuehold")
    actuator = Actuator(settings, cluster.scontrol, io.BytesIO())
    assert actuator.apply(decision)["outcome"] == "applied"
    job = cluster.wait_job(job_id, lambda j: j["JobState"] == "PENDING")
    assert job["Restarts"] == "1" and "held" in job["Reason"].lower()  # requeued held
    assert actuator.apply(decision)["outcome"] == "skipped"  # replayed: held once
    subprocess.run(["scancel", job_id], env=cluster.env, check=True)  # the human's call


def test_a_retry_of_a_job_submitted_with_no_requeue_is_skipped_not_failed(
        cluster: SlurmCluster) -> None:
    """slurmctld refuses to requeue it ("Requested operation is presently disabled"): the
    actuator tried three times and counted the decision failed, an operator's alert."""
    cluster.configure_epilog({})
    job_id = cluster.sbatch(_print(NONDETERMINISTIC_LOG) + "exit 1\n", "once", "--no-requeue")
    cluster.wait_job(job_id, lambda j: j["JobState"] == "FAILED")
    decision = _retry(job_id)
    actuator = Actuator(Settings.from_env({}), cluster.scontrol, io.BytesIO())
    record = actuator.apply(decision)
    assert (record["outcome"], record["commands"]) == ("skipped", []), record
    assert "--no-requeue" in record["why"]
    assert actuator.metrics.registry.get_sample_value(
        "sibylla_actuator_decisions_total", {"action": "retry", "outcome": "failed"}) == 0
    job = cluster.job(job_id)
    assert (job["JobState"], job["Restarts"]) == ("FAILED", "0")

def test_a_retry_on_the_node_the_job_just_failed_on_runs(cluster: SlurmCluster) -> None:
    # slurmd refuses a job's credential created in the second its previous run ended there:
    # started at once ("StartTime=now") on the same node, the retry was killed before it ran
    # and ended FAILED with no output. The actuator lets it start two seconds later. The job
    # ends just after a second begins and the retry is applied at once, so that an immediate
    # start would fall within that second.
    cluster.configure_epilog({})
    cluster.scontrol.run(["update", "nodename=node2", "state=drain", "reason=sibylla-test"])
    try:
        to_next_second = f"{sys.executable} -c 'import time; print(1.05 - time.time() % 1)'"
        job_id = cluster.sbatch(f"echo \"ran on $SLURMD_NODENAME\"\nsleep $({to_next_second})\n"
                                "exit 1\n", "again")
        deadline = time.monotonic() + 60
        while cluster.job(job_id)["JobState"] != "FAILED":
            assert time.monotonic() < deadline, cluster.logs()
            time.sleep(0.02)
        decision = _retry(job_id)
        record = Actuator(Settings.from_env({}), cluster.scontrol, io.BytesIO()).apply(decision)
        assert record["outcome"] == "applied", record
        job = cluster.wait_job(job_id, lambda j: j["JobState"] == "FAILED"
                               and j["Restarts"] == "1")
        output = (cluster.root / "out" / f"again-{job_id}.out").read_text()
        assert output.count("ran on node1") == 2, (output, job, cluster.logs())
    finally:
        cluster.resume_nodes()


def test_a_decision_made_while_slurmctld_restarts_waits_for_it_and_is_applied(
        cluster: SlurmCluster) -> None:
    """A controller restart (an upgrade, a failover, a crash) outlasted the actuator's three
    tries (each scontrol call bounded by ``slurm_command_timeout_s``): the decision was
    audited ``failed``, its offset committed, and the job never retried. Now it waits."""
    cluster.configure_epilog({})
    job_id = cluster.sbatch(_print(NONDETERMINISTIC_LOG) + "exit 1\n", "waits")
    cluster.wait_job(job_id, lambda j: j["JobState"] == "FAILED")
    decision = _retry(job_id)
    # Each call fails within 2 s while the controller is down: three tries took ~9 s.
    scontrol = Scontrol("scontrol", 2.0, {"SLURM_CONF": str(cluster.conf)})
    actuator = Actuator(Settings.from_env({}), scontrol, io.BytesIO())
    registry = actuator.metrics.registry
    cluster.stop_controller()
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        try:
            applying = pool.submit(actuator.apply, decision)
            time.sleep(15.0)
            assert not applying.done(), applying.result()
            # What the operator's alert reads: how long the decision has waited.
            assert registry.get_sample_value("sibylla_actuator_controller_wait_seconds") > 10
        finally:
            cluster.start_controller()
        record = applying.result(timeout=90)
    assert record["outcome"] == "applied", record
    assert registry.get_sample_value("sibylla_actuator_controller_wait_seconds") == 0
    assert registry.get_sample_value("sibylla_actuator_decisions_total",
                                     {"action": "retry", "outcome": "applied"}) == 1
    assert record["tries"] > 3 and "no answer within" in record["last_error"]
    cluster.wait_job(job_id, lambda j: j["JobState"] == "FAILED" and j["Restarts"] == "1")



def test_decisions_piling_up_behind_one_that_waits_for_slurmctld_show_in_the_lag(
        broker: object, cluster: SlurmCluster, unique_prefix: str, tmp_path: Path) -> None:
    """The lag was measured only after a batch: while a decision waited for slurmctld, the
    gauge kept its last value (0) however many decisions came behind it."""
    settings = make_settings(broker.bootstrap_servers,  # type: ignore[attr-defined]
                             unique_prefix, tmp_path, slurm_command_timeout_s=2.0)
    asyncio.run(ensure_topics(settings))
    actuator = ActuatorProcess(settings, cluster, tmp_path / "audit.jsonl")

    def lag_reaches(total: int, timeout_s: float) -> float:
        deadline = time.monotonic() + timeout_s
        while (seen := sum(actuator.lag().values())) != total and time.monotonic() < deadline:
            time.sleep(0.3)
        return seen

    try:  # jobs slurmctld does not know: skipped once it answers
        asyncio.run(_publish(settings, _retry("525250")))
        assert [r["outcome"] for r in actuator.wait_lines(1)] == ["skipped"]
        cluster.stop_controller()
        try:
            asyncio.run(_publish(settings, _retry("525251")))
            time.sleep(3.0)  # the actuator holds it, waiting for slurmctld
            asyncio.run(_publish(settings, _retry("525252"), _retry("525253")))
            # The one in hand and the two behind it.
            assert lag_reaches(3, 15.0) == 3, actuator.lines()
        finally:
            cluster.start_controller()
        assert [r["outcome"] for r in actuator.wait_lines(4)] == ["skipped"] * 4
        assert lag_reaches(0, 10.0) == 0
    finally:
        actuator.stop()


def test_every_actuator_panel_of_the_dashboard_has_data_from_a_live_actuator(
        broker: object, cluster: SlurmCluster, unique_prefix: str, tmp_path: Path) -> None:
    """What an operator's Grafana charts of the actuator, asked of a real Prometheus that
    scrapes a running actuator which applied one decision and skipped another."""
    if (why := prometheus_missing()) is not None:
        pytest.skip(why)
    settings = make_settings(broker.bootstrap_servers,  # type: ignore[attr-defined]
                             unique_prefix, tmp_path)
    asyncio.run(ensure_topics(settings))
    cluster.configure_epilog({})
    job_id = cluster.sbatch(_print(NONDETERMINISTIC_LOG) + "exit 1\n", "charted")
    cluster.wait_job(job_id, lambda j: j["JobState"] == "FAILED")
    actuator = ActuatorProcess(settings, cluster, tmp_path / "audit.jsonl")
    prom = PrometheusProcess(tmp_path / "prometheus",
                             [f"127.0.0.1:{settings.slurm_actuator_metrics_port}"]).start()
    try:
        # Scraped before the decisions come, so that the counters' rise is seen.
        assert prom.wait_for("sibylla_actuator_decisions_total"), prom.tail()
        asyncio.run(_publish(settings, *(
            _retry(job) for job in (job_id, "535353"))))
        assert sorted(r["outcome"] for r in actuator.wait_lines(2)) == ["applied", "skipped"]
        # rate() needs two scrapes after the counters moved.
        assert prom.wait_for("sum(sibylla_actuator_decisions_total) == 2"), prom.tail()
        time.sleep(3)
        queries = dashboard_queries(actuator=True)
        assert len(queries) >= 4
        empty = prom.without_data(queries)
        assert not empty, "queries without data:\n" + "\n".join(empty)
        handled = prom.query("sum by (action, outcome) "
                             "(rate(sibylla_actuator_decisions_total[5m])) * 60 > 0")
        assert sorted(r["metric"]["outcome"] for r in handled) == ["applied", "skipped"]
        assert {r["metric"]["partition"] for r in prom.query("sibylla_actuator_lag")} == {
            str(p) for p in range(settings.partitions)}
    finally:
        prom.stop()
        actuator.stop()
    cluster.wait_job(job_id, lambda j: j["JobState"] == "FAILED" and j["Restarts"] == "1")


class LoopThread:
    """A coroutine on an event loop of its own in a thread (an actuator whose consumer a test
    sets up, or another member of its group), stopped by cancelling it."""

    def __init__(self, coroutine: Coroutine[Any, Any, Any]) -> None:
        self.loop = asyncio.new_event_loop()
        self.task = self.loop.create_task(coroutine)
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.loop.run_until_complete(self.task)
        except asyncio.CancelledError:
            pass
        except BaseException as exc:  # noqa: BLE001 - the test reports it
            self.error = exc

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.task.cancel)
        self.thread.join(30)


async def _group_member(settings: Settings) -> None:
    """A second member of the actuator's group that takes partitions and acts on nothing."""
    consumer = AIOKafkaConsumer(settings.topic("decisions"),
                                bootstrap_servers=settings.bootstrap_servers,
                                group_id=settings.slurm_actuator_group,
                                enable_auto_commit=False)
    await consumer.start()
    try:
        while True:
            await consumer.getmany(timeout_ms=200)
    finally:
        await consumer.stop()


async def _publish(settings: Settings, *decisions: Decision) -> None:
    async with Shipper(settings) as shipper:
        for d in decisions:
            await shipper.send_raw(settings.topic("decisions"), d.job_id.encode(), d.to_json())
        await shipper.flush()


def test_an_actuator_whose_group_moved_on_while_it_waited_applies_and_goes_on(
        broker: object, cluster: SlurmCluster, unique_prefix: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A slurmctld restart longer than the consumer's ``max_poll_interval_ms`` (5 min; 3 s
    here) while another member is in the group (a second actuator): the waiting consumer
    was put out of the group, the commit after applying its decision raised, and the
    actuator exited; no later decision reached Slurm until someone restarted it."""
    audit = tmp_path / "audit.jsonl"
    settings = make_settings(broker.bootstrap_servers,  # type: ignore[attr-defined]
                             unique_prefix, tmp_path, slurm_audit_file=audit,
                             slurm_actuator_metrics_port=0, slurm_command_timeout_s=2.0)
    asyncio.run(ensure_topics(settings))
    cluster.configure_epilog({})
    first, second = (cluster.sbatch(_print(NONDETERMINISTIC_LOG) + "exit 1\n", name)
                     for name in ("long-wait", "after-it"))
    for job_id in (first, second):
        cluster.wait_job(job_id, lambda j: j["JobState"] == "FAILED")
    monkeypatch.setenv("SLURM_CONF", str(cluster.conf))
    monkeypatch.setattr(actuator_module, "AIOKafkaConsumer",
                        functools.partial(AIOKafkaConsumer, max_poll_interval_ms=3000))


    def audited() -> list[tuple[str, str]]:
        lines = audit.read_bytes().splitlines() if audit.exists() else []
        return [(r["job_id"], r["outcome"]) for r in map(orjson.loads, lines)]

    actuator = LoopThread(run_actuator(settings))
    try:
        # Once it has handled a decision (for a job slurmctld does not know), the actuator
        # is the group's only member and owns every partition.
        asyncio.run(_publish(settings, _retry("424242")))
        deadline = time.monotonic() + 60
        while ("424242", "skipped") not in audited() and time.monotonic() < deadline:
            time.sleep(0.2)
        cluster.stop_controller()
        try:
            asyncio.run(_publish(settings, _retry(first)))
            time.sleep(2.0)  # the actuator holds the decision, waiting for slurmctld
            other = LoopThread(_group_member(settings))
            time.sleep(8.0)  # the group goes on without the waiting actuator
        finally:
            cluster.start_controller()
        cluster.wait_job(first, lambda j: j["Restarts"] == "1")
        deadline = time.monotonic() + 30  # its audit line comes once the job is requeued
        while (first, "applied") not in audited() and time.monotonic() < deadline:
            time.sleep(0.2)
        other.stop()
        asyncio.run(_publish(settings, _retry(second)))
        # Its retry ended too: the cluster's epilog publishes into the next test otherwise.
        cluster.wait_job(second, lambda j: j["Restarts"] == "1" and _finished(j), 60.0)
    finally:
        actuator.stop()
    assert actuator.error is None, repr(actuator.error)
    outcomes = audited()
    assert outcomes.count((first, "applied")) == 1 and (second, "applied") in outcomes, outcomes


def test_a_job_on_every_node_sent_elsewhere_runs_again_where_it_can(
        cluster: SlurmCluster) -> None:
    """retry_elsewhere for a job that needs both nodes: excluding its failed node, as the
    decision asks, left it pending for ever (Slurm takes the ExcNodeList); it now runs again
    on what the partition has, and the audit says which node it could not avoid."""
    cluster.configure_epilog({})
    job_id = cluster.sbatch(_print(NONDETERMINISTIC_LOG) + "exit 1\n", "wide", "-N2")
    cluster.wait_job(job_id, lambda j: j["JobState"] == "FAILED")
    decision = _elsewhere(job_id, "node1")
    record = Actuator(Settings.from_env({}), cluster.scontrol, io.BytesIO()).apply(decision)
    assert record["outcome"] == "applied", record
    assert record["note"].startswith("not excluded: node1 (the job needs 2 of the 2 nodes")
    job = cluster.wait_job(job_id, lambda j: j["Restarts"] == "1" and _finished(j), 60.0)
    assert job["ExcNodeList"] == "(null)"


def test_a_job_sent_elsewhere_with_the_other_nodes_down_runs_again_where_it_can(
        cluster: SlurmCluster) -> None:
    """Counting the partition's nodes whatever their state, node1 was excluded although
    node2 is down: the job waited for node2's repair."""
    cluster.configure_epilog({})
    cluster.scontrol.run(["update", "nodename=node2", "state=down", "reason=sibylla-test"])
    try:
        job_id = cluster.sbatch(_print(NONDETERMINISTIC_LOG) + "exit 1\n", "cornered")
        cluster.wait_job(job_id, lambda j: j["JobState"] == "FAILED")
        decision = _elsewhere(job_id, "node1")
        record = Actuator(Settings.from_env({}), cluster.scontrol, io.BytesIO()).apply(decision)
        assert record["note"].startswith("not excluded: node1 (the job needs 1 of the 1 nodes")
        cluster.wait_job(job_id, lambda j: j["Restarts"] == "1" and _finished(j), 60.0)
    finally:
        cluster.resume_nodes()


def test_jobs_sent_elsewhere_around_a_maintenance_reservation_run_again_where_they_can(
        cluster: SlurmCluster) -> None:
    """node2 in a maintenance reservation: counted as room, node1 was excluded from a job
    outside the reservation, which then waited for the reservation's end (``ReqNodeNotAvail,
    May be reserved for other job``); a job inside it, sent away from node2, was excluded
    from the only node it may use."""
    cluster.configure_epilog({})
    cluster.scontrol.run(["create", "reservation", "ReservationName=maint", "Nodes=node2",
                          "StartTime=now", "Duration=60", "Users=root",
                          "Flags=MAINT,IGNORE_JOBS"])
    outside = cluster.sbatch(_print(NONDETERMINISTIC_LOG) + "exit 1\n", "outside")
    inside = cluster.sbatch(_print(NONDETERMINISTIC_LOG) + "exit 1\n", "inside",
                            "--reservation=maint")
    try:
        actuator = Actuator(Settings.from_env({}), cluster.scontrol, io.BytesIO())
        for job_id, node in ((outside, "node1"), (inside, "node2")):
            job = cluster.wait_job(job_id, lambda j: j["JobState"] == "FAILED")
            assert job["NodeList"] == node
            decision = _elsewhere(job_id, node)
            record = actuator.apply(decision)
            assert record.get("note", "").startswith(
                f"not excluded: {node} (the job needs 1 of the 1 nodes"), record
        for job_id, node in ((outside, "node1"), (inside, "node2")):
            job = cluster.wait_job(job_id, lambda j: j["Restarts"] == "1" and _finished(j),
                                   60.0)
            assert (job["NodeList"], job["ExcNodeList"]) == (node, "(null)")
    finally:  # a job left pending in the reservation would keep it from being deleted
        subprocess.run(["scancel", outside, inside], env=cluster.env, check=True)
        cluster.scontrol.run(["delete", "ReservationName=maint"])


def test_a_retried_task_of_a_job_array_is_requeued_alone(cluster: SlurmCluster) -> None:
    """The array's last task keeps the array's id as its JobId, which the epilog publishes:
    ``scontrol requeue <that id>`` requeued every task of the array, those decided
    do_not_retry too. Only the decided task runs again."""
    cluster.configure_epilog({})
    array_id = cluster.sbatch(_print(NONDETERMINISTIC_LOG) + "exit 1\n", "sweep", "--array=0-2")
    cluster.wait_array_failed(array_id, 3)
    last = cluster.job(array_id)  # the task that has the array's id as its own
    decision = _retry(array_id)
    record = Actuator(Settings.from_env({}), cluster.scontrol, io.BytesIO()).apply(decision)
    cluster.wait_job(array_id, lambda j: j["Restarts"] == "1" and _finished(j), 60.0)
    assert sorted(t["Restarts"] for t in cluster.scontrol.show_jobs(array_id)) == ["0", "0", "1"]
    assert record["commands"][0] == [
        "scontrol", "requeue", f"{array_id}_{last['ArrayTaskId']}"], record


def test_each_task_of_a_job_array_ships_its_own_output(
        broker: object, cluster: SlurmCluster, unique_prefix: str, tmp_path: Path) -> None:
    """A sweep writes one file per task (``%A_%a``); slurmctld's epilog runs once per task,
    and each task's attempt reaches the broker under its own job id with its own lines."""
    settings = make_settings(broker.bootstrap_servers,  # type: ignore[attr-defined]
                             unique_prefix, tmp_path)
    asyncio.run(ensure_topics(settings))
    cluster.configure_epilog(settings.to_env())
    array_id = cluster.sbatch("echo \"task $SLURM_ARRAY_TASK_ID: RuntimeError: NCCL timeout\"\n"
                              "exit 1\n", "sweep", "--array=0-1",
                              "-o", str(cluster.root / "out" / "sweep-%A_%a.out"))
    tasks = cluster.wait_array_failed(array_id, 2)
    task_of = {t["JobId"]: t["ArrayTaskId"] for t in tasks}
    want = {job_id: [f"task {task}: RuntimeError: NCCL timeout"]
            for job_id, task in task_of.items()}
    deadline = time.monotonic() + 30  # the epilog publishes after the job's end
    shipped: dict[str, list[str]] = {}
    while shipped != want and time.monotonic() < deadline:
        records = asyncio.run(read_all(settings, "logs", idle_s=1.0))
        chunks = [parse_log_record(orjson.dumps(r), settings.max_line_bytes) for r in records]
        # The cluster outlives tests: a job an earlier test requeued may end meanwhile, and
        # the epilog, configured for this test now, publishes its attempt here too.
        shipped = {c.job_id: c.lines for c in chunks if c.job_id in task_of}
    assert shipped == want, cluster.logs()
    events = asyncio.run(read_all(settings, "job-events", idle_s=1.0))
    assert sorted((e["job_id"], e["state"]) for e in events if e["job_id"] in task_of) == sorted(
        (job_id, "FAILED") for job_id in task_of)


def test_a_heterogeneous_job_gets_one_decision_which_requeues_all_of_it(
        broker: object, cluster: SlurmCluster, unique_prefix: str, tmp_path: Path) -> None:
    """slurmctld runs the epilog once per component of a heterogeneous job: each published
    an attempt, the worker decided each, and scontrol refused the second component's
    requeue ("Job not heterogeneous job leader"): a decision counted failed, an alert. The
    leader's epilog alone publishes; a retry of the leader requeues every component."""
    settings = make_settings(broker.bootstrap_servers,  # type: ignore[attr-defined]
                             unique_prefix, tmp_path)
    asyncio.run(ensure_topics(settings))
    cluster.configure_epilog(settings.to_env())
    leader = cluster.sbatch("#SBATCH -n1\n#SBATCH hetjob\n#SBATCH -n1\n"
                            + _print(NONDETERMINISTIC_LOG) + "exit 1\n", "hetero")
    component = str(int(leader) + 1)
    for job_id in (leader, component):
        assert cluster.wait_job(job_id, lambda j: j["JobState"] == "FAILED")["HetJobId"] == leader
    deadline = time.monotonic() + 30  # the epilog publishes after the job's end
    published: set[str] = set()
    while leader not in published and time.monotonic() < deadline:
        records = asyncio.run(read_all(settings, "job-events", idle_s=1.0))
        published = {r["job_id"] for r in records if r["job_id"] in (leader, component)}
    time.sleep(2.0)  # the component's epilog, had it published, would have by now
    records = asyncio.run(read_all(settings, "job-events", idle_s=1.0))
    assert sorted(r["job_id"] for r in records
                  if r["job_id"] in (leader, component)) == [leader], cluster.logs()

    actuator = Actuator(Settings.from_env({}), cluster.scontrol, io.BytesIO())
    outcomes = [actuator.apply(_retry(job_id))["outcome"]
                for job_id in (component, leader)]  # one published by another shipper, too
    assert outcomes == ["skipped", "applied"]
    # Both components requeued. Only Slurm's backfill starts a heterogeneous job, and it skips
    # its cycles while nothing changes: on this quiet cluster the job sometimes stayed PENDING
    # (Reason=None) for minutes (README), so it is cancelled rather than left to run into the
    # next test's epilog.
    try:
        for job_id in (leader, component):
            cluster.wait_job(job_id, lambda j: j["Restarts"] == "1", 30.0)
    finally:
        subprocess.run(["scancel", leader], env=cluster.env, check=True)
