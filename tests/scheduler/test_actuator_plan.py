"""What the actuator does to a job for each decision, given the job as slurmctld shows it."""

from __future__ import annotations

import dataclasses
import functools
import io

import orjson
import pytest

from sibylla.scheduler.actuator import Actuator, ActuatorStopped, Room, plan
from sibylla.scheduler.metrics import ActuatorMetrics
from sibylla.scheduler.scontrol import Scontrol, SlurmError
from sibylla.schemas.records import Decision
from sibylla.settings import Settings

SETTINGS = Settings.from_env({})
NOW = 1_800_000_000.0


def _decision(action: str, attempt: int = 0, state: str = "FAILED", **fields: object
              ) -> Decision:
    d = Decision("42", attempt, "nondeterministic", 0.99, "collective_timeout",
                 action, [], [], "m", NOW, 5.0, state=state)  # type: ignore[arg-type]
    return dataclasses.replace(d, **fields)  # type: ignore[arg-type]


def _job(state: str = "FAILED", restarts: int = 0, **fields: str) -> dict[str, str]:
    return {"JobId": "42", "JobState": state, "Restarts": str(restarts), "Reason": "None",
            "ExcNodeList": "(null)", "EndTime": "2000-01-01T00:00:00", **fields}


def test_retry_requeues_a_failed_job_and_lets_it_start_now() -> None:
    assert plan(_decision("retry"), _job(), SETTINGS).commands == [
        ["requeue", "42"], ["update", "jobid=42", "StartTime=now+2"]]


def test_retry_elsewhere_adds_the_nodes_to_the_exclusion_list() -> None:
    d = _decision("retry_elsewhere", avoid_nodes=["gpu07"], exclude_nodes=["gpu03", "gpu07"])
    room = Room(tuple(f"gpu0{i}" for i in range(1, 9)), ("gpu01", "gpu03"))
    assert plan(d, _job(ExcNodeList="gpu01,gpu03"), SETTINGS, room).commands == [
        ["requeue", "42"],
        ["update", "jobid=42", "StartTime=now+2", "ExcNodeList=gpu01,gpu03,gpu07"]]


def test_retry_elsewhere_never_leaves_a_job_fewer_nodes_than_it_needs() -> None:
    """Slurm takes such an ExcNodeList and keeps the job pending for ever (seen on the test
    cluster): the most recently blamed nodes are excluded while enough are left."""
    gpus = tuple(f"gpu0{i}" for i in range(1, 9))
    d = _decision("retry_elsewhere", exclude_nodes=["gpu01", "gpu02", "gpu03", "cpu99"])
    got = plan(d, _job(NumNodes="6"), SETTINGS, Room(gpus, ()))
    assert got.commands == [
        ["requeue", "42"],
        ["update", "jobid=42", "StartTime=now+2", "ExcNodeList=gpu02,gpu03,cpu99"]]
    assert got.note == ("not excluded: gpu01 (the job needs 6 of the 8 nodes of its "
                        "partition that take jobs and are open to it, 6 left)")
    # A job on the whole partition is requeued where it ran; what it excluded stays.
    whole = plan(d, _job(NumNodes="7-8", ExcNodeList="gpu0[7-8]"), SETTINGS,
                 Room(gpus, ("gpu07", "gpu08")))
    assert whole.commands == [
        ["requeue", "42"],
        ["update", "jobid=42", "StartTime=now+2", "ExcNodeList=gpu07,gpu08,cpu99"]]
    assert whole.note.startswith("not excluded: gpu01,gpu02,gpu03 (the job needs 7")


@pytest.mark.parametrize("action", ["retry", "retry_elsewhere", "default_policy"])
def test_a_job_that_may_not_be_requeued_is_left_failed_with_the_reason(action: str) -> None:
    """slurmctld refuses to requeue a job submitted with --no-requeue: the actuator tried
    three times and reported the decision failed, which pages an operator."""
    got = plan(_decision(action), _job(Requeue="0"), SETTINGS, Room(("gpu01", "gpu02"), ()))
    assert got.commands == []
    assert "may not be requeued (sbatch --no-requeue" in got.why
    held = dataclasses.replace(SETTINGS, slurm_do_not_retry="requeuehold")
    assert plan(_decision("do_not_retry"), _job(Requeue="0"), held).commands == []

def test_a_job_array_task_is_named_alone_not_by_the_arrays_id() -> None:
    """The array's last task keeps the array's id as its JobId; scontrol applies that id to
    every task of the array."""
    last = _job(ArrayJobId="42", ArrayTaskId="3")
    assert plan(_decision("retry"), last, SETTINGS).commands == [
        ["requeue", "42_3"], ["update", "jobid=42_3", "StartTime=now+2"]]
    other = _job(JobId="44", ArrayJobId="42", ArrayTaskId="1")
    assert plan(_decision("retry", job_id="44"), other, SETTINGS).commands[0] == [
        "requeue", "42_1"]
    held = dataclasses.replace(SETTINGS, slurm_do_not_retry="requeuehold")
    assert plan(_decision("do_not_retry"), last, held).commands == [["requeuehold", "42_3"]]

def test_only_a_decision_on_a_heterogeneous_jobs_leader_acts() -> None:
    """scontrol refuses to requeue a component ("Job not heterogeneous job leader")."""
    component = _job(HetJobId="41", HetJobOffset="1")
    got = plan(_decision("retry"), component, SETTINGS)
    assert got.commands == [] and "a component of heterogeneous job 41" in got.why
    leader = _job(HetJobId="42", HetJobOffset="0")
    assert plan(_decision("retry"), leader, SETTINGS).commands[0] == ["requeue", "42"]

def test_do_not_retry_leaves_the_job_failed_or_holds_it_for_a_human() -> None:
    left = plan(_decision("do_not_retry"), _job(), SETTINGS)
    assert left.commands == [] and "stays failed" in left.why
    held = dataclasses.replace(SETTINGS, slurm_do_not_retry="requeuehold")
    assert plan(_decision("do_not_retry"), _job(), held).commands == [["requeuehold", "42"]]


@pytest.mark.parametrize("restarts, requeued", [(0, True), (1, False)])
def test_default_policy_requeues_up_to_the_site_limit(restarts: int, requeued: bool) -> None:
    got = plan(_decision("default_policy", attempt=restarts), _job(restarts=restarts),
               SETTINGS)  # slurm_default_retries = 1
    assert bool(got.commands) is requeued


def test_a_replayed_decision_does_nothing_once_the_job_moved_on() -> None:
    for job in (_job("PENDING", 1), _job("RUNNING", 1), _job("COMPLETED", 1),
                _job("FAILED", 2)):
        got = plan(_decision("retry"), job, SETTINGS)
        assert got.commands == [] and "already handled" in got.why


def test_a_job_slurm_requeued_after_a_node_failure_is_kept_off_the_node() -> None:
    d = _decision("retry_elsewhere", state="NODE_FAIL", exclude_nodes=["node1"])
    pending = _job("PENDING", 1, Reason="BeginTime")
    nodes = ("node1", "node2")
    assert plan(d, pending, SETTINGS, Room(nodes, ())).commands == [
        ["update", "jobid=42", "StartTime=now+2", "ExcNodeList=node1"]]
    done = plan(d, _job("PENDING", 1, Reason="Priority", ExcNodeList="node1"), SETTINGS,
                Room(nodes, ("node1",)))
    assert done.commands == [] and "already applied" in done.why
    stop = _decision("do_not_retry", state="NODE_FAIL")
    assert plan(stop, pending, SETTINGS).commands == [["hold", "42"]]


def test_a_decision_older_than_the_attempt_it_names_is_ignored() -> None:
    got = plan(_decision("retry"), _job(EndTime="2030-01-01T00:00:00"), SETTINGS)
    assert got.commands == [] and "predates" in got.why


def test_an_unknown_job_is_skipped() -> None:
    assert "does not know" in plan(_decision("retry"), None, SETTINGS).why


def test_when_scontrol_keeps_failing_the_decision_is_reported_failed_after_retries() -> None:
    waits: list[float] = []
    audit = io.BytesIO()
    actuator = Actuator(SETTINGS, Scontrol("false", 5.0), audit, sleep=waits.append)
    record = actuator.apply(_decision("retry"))
    assert (record["outcome"], record["tries"]) == ("failed", 3)
    assert "scontrol show job -o 42" in record["why"]
    assert waits == [1.0, 2.0]
    assert orjson.loads(audit.getvalue())["outcome"] == "failed"
    assert actuator.metrics.registry.get_sample_value(
        "sibylla_actuator_decisions_total", {"action": "retry", "outcome": "failed"}) == 1


class _ControllerDown(Scontrol):
    """scontrol as it fails while slurmctld is down: no answer within its timeout."""

    def run(self, args: list[str]) -> str:  # type: ignore[override]
        raise SlurmError(f"scontrol {' '.join(args)}: no answer within 5 s")


def test_while_slurmctld_does_not_answer_a_decision_waits_until_the_actuator_stops() -> None:
    """Never reported failed (its offset would be committed and the job never retried);
    a stop ends the wait without an audit line, so the decision comes again at the next
    start."""
    audit, waits, waited = io.BytesIO(), [], []
    actuator = Actuator(SETTINGS, _ControllerDown(), audit)
    registry = actuator.metrics.registry

    def sleep(seconds: float) -> None:
        waits.append(seconds)
        waited.append(registry.get_sample_value("sibylla_actuator_controller_wait_seconds"))
        if len(waits) == 8:
            actuator.stopping.set()
    actuator.sleep = sleep
    with pytest.raises(ActuatorStopped):
        actuator.apply(_decision("retry"))
    assert waits == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0]
    assert audit.getvalue() == b""
    # The wait an operator's alert reads grows from the first unanswered call, and ends
    # with it; a stopped decision is not counted as handled.
    assert waited == sorted(waited) and waited[0] > 0
    assert registry.get_sample_value("sibylla_actuator_controller_wait_seconds") == 0
    assert registry.get_sample_value("sibylla_actuator_last_decision_timestamp_seconds") == 0


def test_the_lag_of_a_partition_another_actuator_took_is_no_longer_reported() -> None:
    """Summed over a group's actuators, a stale value would count its decisions twice."""
    metrics = ActuatorMetrics()
    metrics.set_lag({0: 5, 1: 2})
    metrics.set_lag({1: 0})  # partition 0 went to another member of the group
    lag = functools.partial(metrics.registry.get_sample_value, "sibylla_actuator_lag")
    assert (lag({"partition": "0"}), lag({"partition": "1"})) == (None, 0)
