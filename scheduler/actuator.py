"""``sibylla slurm actuator``: applies Sibylla's decisions to Slurm jobs.

It follows ``sibylla.decisions`` in a consumer group of its own and, per decision, looks at the
job (``scontrol show job``) before it acts, so that a decision replayed after a restart or a
rebalance does nothing twice:

- the job ended the decided attempt and is still finished (``Restarts`` equals the attempt):
  ``retry`` requeues it and lets it start in :data:`START_DELAY_S` (a requeued job otherwise
  waits 120 s);
  ``retry_elsewhere`` does the same with the excluded nodes added to ``ExcNodeList``;
  ``do_not_retry`` leaves it failed (or ``requeuehold`` for a human, by setting);
  ``default_policy`` applies the site's rule (requeue while the job restarted fewer than
  ``slurm_default_retries`` times);
- slurmctld requeued the job itself (a node failure: the decision's state is NODE_FAIL and the
  job is pending at the next attempt): ``retry_elsewhere`` updates ``ExcNodeList`` and lets it
  start now, ``do_not_retry`` holds it;
- anything else (the job moved on, is unknown, or the decision predates the attempt's end) is
  skipped with the reason.

Each decision handled writes one JSON audit line. Offsets are committed after the action, so a
crash replays at most the decision in hand, which the checks above make harmless. While
slurmctld does not answer (restarting, failing over, an upgrade) the decision in hand waits for
it, however long: given up after a few tries, as scontrol's refusals are, it would be lost to
the scheduler by a controller restart longer than ~20 s.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition
from aiokafka.errors import CommitFailedError, IllegalStateError

from sibylla.scheduler.audit import AuditFile, AuditSink
from sibylla.scheduler.metrics import ActuatorMetrics
from sibylla.scheduler.scontrol import Scontrol, SlurmError, timestamp
from sibylla.schemas.records import Decision, RecordError
from sibylla.settings import Settings

__all__ = ["Actuator", "ActuatorStopped", "Plan", "Room", "controller_unreachable", "plan",
           "run_actuator"]

log = logging.getLogger(__name__)

_FINISHED_FAILED = frozenset({"FAILED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL", "BOOT_FAIL",
                              "DEADLINE"})
_REQUEUED_BY_SLURM = frozenset({"NODE_FAIL"})
_CLOCK_SLACK_S = 5.0  # controller and worker clocks may differ this much
_TRIES = 3  # scontrol refusals per decision before it is reported failed and left
# What scontrol says when slurmctld does not answer, rather than refuses (Slurm 22.05 with the
# controller down: "slurm_load_jobs error: Unable to contact slurm controller (connect
# failure)" after ~18 s, so usually our own timeout first).
_UNREACHABLE = ("Unable to contact slurm controller", "no answer within", "Socket timed out",
                "backup controller in standby mode")
_MAX_BACKOFF_S = 30.0  # the longest wait between tries while slurmctld does not answer
# Seconds after the update before a requeued job may start, not 0 ("now"). slurmd revokes a
# job's credential when the job ends and refuses any credential of that job created in the
# same second or earlier (slurm_cred.c compares whole seconds): a retry started at once on
# the node it just ended on is killed before it runs ("Killing non-startable batch JobId=7:
# Job credential revoked" in slurmctld's log), a failed attempt without a line of output
# that the test cluster hit when the retry landed within the second of the previous end.
# Slurm's own 120 s wait after a requeue avoids it too; two seconds are enough.
START_DELAY_S = 2
_BACKOFF_S = 1.0
_LAG_INTERVAL_S = 1.0  # how often the lag is measured


@dataclass(frozen=True)
class Plan:
    """What to do about one decision: scontrol calls (in order), or why nothing; ``note``:
    what the calls leave out of the decision, and why."""

    commands: list[list[str]] = field(default_factory=list)
    why: str = ""
    note: str = ""


@dataclass(frozen=True)
class Room:
    """Where a job can run: its partition's nodes that take jobs now (not down or drained)
    and are open to it (not held by a reservation it is not in), and the nodes it already
    excludes (both expanded; ``scontrol show job`` may print ``ExcNodeList=gpu[01-03]``)."""

    nodes: tuple[str, ...]
    excluded: tuple[str, ...]


def _nodes_needed(job: Mapping[str, str]) -> int:
    """The fewest nodes the job runs on (``NumNodes=2`` or ``2-4``)."""
    low = job.get("NumNodes", "1").split("-")[0]
    return int(low) if low.isdigit() else 1


def _exclusion(job: Mapping[str, str], decision: Decision, room: Room | None
               ) -> tuple[str | None, str]:
    """The job's new ExcNodeList: its excluded nodes with the decision's added (order kept, no
    repeats), None when that changes nothing; and a note on the nodes left out. Slurm takes
    an ExcNodeList that leaves a job fewer nodes than it needs and keeps the job pending for
    ever, so a node is added only while the nodes of its Room keep enough (the most
    recently blamed node first). A job that needs all of them is requeued where it
    was."""
    if room is None:
        raise ValueError("retry_elsewhere is planned with where the job can run (a Room)")
    excluded = list(room.excluded)
    wanted = [n for n in dict.fromkeys(decision.exclude_nodes or decision.avoid_nodes)
              if n not in excluded]
    usable, need = set(room.nodes) - set(excluded), _nodes_needed(job)
    left_in: list[str] = []
    for node in reversed(wanted):  # the decision lists the most recently blamed last
        if node in usable:
            if len(usable) <= need:
                left_in.append(node)
                continue
            usable.discard(node)
    added = [n for n in wanted if n not in left_in]
    note = (f"not excluded: {','.join(reversed(left_in))} (the job needs {need} of the "
            f"{len(room.nodes)} nodes of its partition that take jobs and are open to it, "
            f"{len(usable)} left)" if left_in else "")
    return (",".join(excluded + added) if added else None), note


def _release(start_now: list[str], exclusion: str | None) -> list[str]:
    """The update that lets a requeued job start, with its new ExcNodeList if any."""
    return ["update", *start_now, *([f"ExcNodeList={exclusion}"] if exclusion else [])]


def _command_id(job: Mapping[str, str], job_id: str) -> str:
    """The id that names this job alone in scontrol's commands: a job array's task as
    ``<ArrayJobId>_<ArrayTaskId>``. The array's last task keeps the array's id as its own
    ``JobId``, and scontrol applies that id to every task of the array: on the test cluster
    ``scontrol requeue 1``, meant for the failed task whose JobId is 1, requeued all four
    tasks of array 1."""
    task = job.get("ArrayTaskId", "")
    return f"{job['ArrayJobId']}_{task}" if task.isdigit() and job.get("ArrayJobId") else job_id


def plan(decision: Decision, job: Mapping[str, str] | None, settings: Settings,
         room: Room | None = None) -> Plan:
    """The scontrol calls that apply ``decision`` to the job as it is now (pure: no calls);
    ``room``: where the job can run, which ``retry_elsewhere`` needs."""
    attempt, action = decision.attempt, decision.action
    if job is None:
        return Plan(why="slurmctld does not know the job (any more)")
    if job.get("HetJobId", decision.job_id) != decision.job_id:
        return Plan(why=f"a component of heterogeneous job {job['HetJobId']}: only a decision "
                        "on its leader acts on the job (scontrol refuses a component)")
    job_id = _command_id(job, decision.job_id)
    restarts = int(job.get("Restarts", "0") or 0)
    state = job.get("JobState", "")
    start_now = [f"jobid={job_id}", f"StartTime=now+{START_DELAY_S}"]
    if restarts == attempt and state in _FINISHED_FAILED:
        ended = timestamp(job.get("EndTime", ""))
        if ended is not None and decision.decided_at + _CLOCK_SLACK_S < ended:
            return Plan(why="the decision predates the end of this attempt (a reused job id?)")
        if action == "default_policy":
            if restarts < settings.slurm_default_retries:
                action = "retry"
            else:
                return Plan(why=f"site rule: the job restarted {restarts} times "
                                f"(slurm_default_retries={settings.slurm_default_retries})")
        requeues = action in ("retry", "retry_elsewhere") or (
            settings.slurm_do_not_retry == "requeuehold")
        if requeues and job.get("Requeue") == "0":
            # Slurm refuses ("Requested operation is presently disabled"): three tries, an
            # outcome `failed` and an operator's alert for a job that said so itself.
            return Plan(why=f"{action}: the job may not be requeued (sbatch --no-requeue, or "
                            "JobRequeue=0 in slurm.conf); it stays failed")
        if action == "retry":
            return Plan([["requeue", job_id], ["update", *start_now]])
        if action == "retry_elsewhere":
            exclusion, note = _exclusion(job, decision, room)
            return Plan([["requeue", job_id], _release(start_now, exclusion)], note=note)
        if settings.slurm_do_not_retry == "requeuehold":
            return Plan([["requeuehold", job_id]])
        return Plan(why="do_not_retry: the job stays failed")
    if (restarts == attempt + 1 and state == "PENDING"
            and decision.state in _REQUEUED_BY_SLURM):
        if action == "retry_elsewhere":
            exclusion, note = _exclusion(job, decision, room)
            if exclusion is None and job.get("Reason") != "BeginTime":
                return Plan(why="already applied: nodes excluded, start time released",
                            note=note)
            return Plan([_release(start_now, exclusion)], note=note)
        if action == "retry":
            return Plan([["update", *start_now]])
        if action == "do_not_retry":
            if job.get("Reason", "").startswith("JobHeld"):
                return Plan(why="already applied: the job is held")
            return Plan([["hold", job_id]])
        return Plan(why="default_policy: slurmctld's own requeue stands")
    return Plan(why=f"the job is {state} at restart {restarts}, not the failed attempt "
                    f"{attempt} (already handled, or moved on)")


def controller_unreachable(error: SlurmError) -> bool:
    """Did scontrol fail because slurmctld did not answer (worth waiting for), rather than
    because it refused the command?"""
    return any(sign in str(error) for sign in _UNREACHABLE)


class ActuatorStopped(Exception):
    """The actuator was told to stop while a decision waited for slurmctld; the decision is
    not committed and comes again at the next start."""


class Actuator:
    """Applies decisions one at a time; ``audit`` gets one JSON line per decision, and
    ``metrics`` counts it.

    ``sleep`` waits between tries (by default until :attr:`stopping` is set, so that a stop
    ends a wait for slurmctld at once)."""

    def __init__(self, settings: Settings, scontrol: Scontrol, audit: AuditSink,
                 sleep: Callable[[float], Any] | None = None,
                 metrics: ActuatorMetrics | None = None) -> None:
        self.settings = settings
        self.scontrol = scontrol
        self.audit = audit
        self.metrics = metrics or ActuatorMetrics()
        self.stopping = threading.Event()
        self.sleep = sleep if sleep is not None else self.stopping.wait

    def _settled(self, job_id: str) -> dict[str, str] | None:
        """The job once it has left COMPLETING (its epilog may still be running), or as it is
        after ``slurm_settle_s``."""
        deadline = time.monotonic() + self.settings.slurm_settle_s
        while True:
            job = self.scontrol.show_job(job_id)
            if job is None or job.get("JobState") != "COMPLETING":
                return job
            if time.monotonic() > deadline:
                return job
            self.sleep(0.25)

    def _room(self, job: Mapping[str, str]) -> Room:
        """Where the job can run now. A job in a reservation runs only on its nodes; any
        other job on no node an active reservation holds (a maintenance window: a job
        excluded onto such nodes waits for its end, ``ReqNodeNotAvail, May be reserved for
        other job``). Where Slurm is more lenient (a node only partly reserved, a
        ``MAGNETIC`` reservation that takes jobs not naming it, a ``FLEX`` one whose jobs may
        also run outside it) the room counted is smaller than Slurm's: the job keeps more of
        its nodes, never fewer than it needs."""
        reservations = self.scontrol.active_reservations()
        own = [name for name in job.get("Reservation", "").split(",") if name in reservations]
        allowed = {n for name in own for n in reservations[name]}
        barred = {n for nodes in reservations.values() for n in nodes}
        nodes = [n for n in self.scontrol.usable_nodes(job.get("Partition", ""))
                 if (n in allowed if own else n not in barred)]
        return Room(tuple(nodes), tuple(self.scontrol.hostnames(job.get("ExcNodeList", ""))))

    def apply(self, decision: Decision) -> dict[str, Any]:
        """Apply one decision; returns (and writes) its audit record."""
        record: dict[str, Any] = {
            "at": time.time(), "job_id": decision.job_id, "attempt": decision.attempt,
            "action": decision.action, "rule": decision.rule, "verdict": decision.verdict,
            "category": decision.category, "commands": [],
        }
        try:
            self._apply(decision, record)
        finally:
            self.metrics.waiting_since = None
        self.audit.write(orjson.dumps(record) + b"\n")
        self.audit.flush()
        self.metrics.handled(decision.action, record["outcome"])
        return record

    def _apply(self, decision: Decision, record: dict[str, Any]) -> None:
        """Try until the decision is applied, skipped or refused for good (its outcome in
        ``record``), waiting for slurmctld as long as it does not answer."""
        tries = refused = 0
        while True:
            tries += 1
            try:
                # Planned anew on each try: a half-applied plan (requeued, not yet released)
                # is seen as such and not requeued twice (Slurm then starts it after 120 s).
                job = self._settled(decision.job_id)
                room = (self._room(job) if job is not None
                        and decision.action == "retry_elsewhere" else None)
                todo = plan(decision, job, self.settings, room)
                record["commands"] = [["scontrol", *c] for c in todo.commands]
                if todo.note:
                    record["note"] = todo.note
                if not todo.commands:
                    record.update(outcome="skipped", why=todo.why)
                elif self.settings.slurm_mode == "dry-run":
                    record.update(outcome="dry-run", why="slurm_mode=dry-run: nothing run")
                else:
                    for command in todo.commands:
                        self.scontrol.run(command)
                    record["outcome"] = "applied"
                break
            except SlurmError as exc:
                record.update(tries=tries, last_error=str(exc))
                if controller_unreachable(exc):
                    if self.metrics.waiting_since is None:
                        self.metrics.waiting_since = time.monotonic()
                    if self.stopping.is_set():
                        raise ActuatorStopped(decision.job_id) from exc
                    wait = min(_BACKOFF_S * 2 ** (tries - refused - 1), _MAX_BACKOFF_S)
                    log.warning("slurm actuator: slurmctld does not answer (%s); job %s "
                                "waits, trying again in %g s", exc, decision.job_id, wait)
                else:  # refused: try again a few times (a busy controller), then report
                    self.metrics.waiting_since = None
                    refused += 1
                    if refused == _TRIES:
                        record.update(outcome="failed", why=record.pop("last_error"))
                        break
                    wait = _BACKOFF_S * 2 ** (refused - 1)
                self.sleep(wait)


async def run_actuator(settings: Settings) -> int:
    """Follow the decisions topic and apply each decision, until stopped."""
    out = (AuditFile(Path(settings.slurm_audit_file)) if settings.slurm_audit_file
           else sys.stdout.buffer)
    actuator = Actuator(settings, Scontrol(settings.slurm_scontrol,
                                           settings.slurm_command_timeout_s), out)
    if settings.slurm_actuator_metrics_port:
        from prometheus_client import start_http_server

        start_http_server(settings.slurm_actuator_metrics_port,
                          registry=actuator.metrics.registry)
    consumer = AIOKafkaConsumer(
        settings.topic("decisions"), bootstrap_servers=settings.bootstrap_servers,
        group_id=settings.slurm_actuator_group, enable_auto_commit=False,
        auto_offset_reset="earliest", **settings.kafka_client_options())
    await consumer.start()
    log.info("slurm actuator: following %s as group %s (%s)", settings.topic("decisions"),
             settings.slurm_actuator_group, settings.slurm_mode)
    in_hand: collections.Counter[TopicPartition] = collections.Counter()
    # Measured beside the loop below, which stands still while a decision waits for
    # slurmctld: the decisions piling up behind the wait show.
    lag_reporter = asyncio.create_task(_report_lag(consumer, actuator.metrics, in_hand))
    try:
        while True:
            batch = await consumer.getmany(timeout_ms=500)
            await _apply_batch(consumer, actuator, batch, in_hand)
    finally:
        lag_reporter.cancel()
        actuator.stopping.set()  # a decision waiting for slurmctld stops waiting
        await consumer.stop()
        if isinstance(out, AuditFile):
            out.close()


async def _apply_batch(consumer: AIOKafkaConsumer, actuator: Actuator,
                       batch: Mapping[TopicPartition, list[ConsumerRecord[Any, Any]]],
                       in_hand: collections.Counter[TopicPartition]) -> None:
    """Apply and commit each decision of ``batch`` in turn; ``in_hand`` counts, per
    partition, the batch's decisions not yet handled (the consumer's position is already past
    them).

    A decision that waited for slurmctld longer than the consumer's ``max_poll_interval_ms``
    (5 min) made the consumer leave its group; where another member (a second actuator) took
    its partitions meanwhile, its commit fails, and so would the rest of the batch's. The
    decision was applied; the next fetch rejoins the group, and whoever gets the decision
    again skips it (the job has moved on)."""
    in_hand.update({tp: len(records) for tp, records in batch.items()})
    try:
        for tp, records in batch.items():
            for message in records:
                await _handle(actuator, message.value)
                in_hand[tp] -= 1
                try:
                    await consumer.commit({TopicPartition(tp.topic, tp.partition):
                                           message.offset + 1})
                except (CommitFailedError, IllegalStateError) as exc:
                    log.warning("slurm actuator: the decision at %s[%d]@%d was applied but "
                                "not committed: the group moved on while it waited (%s); "
                                "fetching again", tp.topic, tp.partition, message.offset, exc)
                    return
    finally:
        in_hand.clear()


async def _report_lag(consumer: AIOKafkaConsumer, metrics: ActuatorMetrics,
                      in_hand: Mapping[TopicPartition, int]) -> None:
    """Every :data:`_LAG_INTERVAL_S`, whatever the apply loop is doing, the decisions not yet
    handled per owned partition: the partition's end as the consumer's fetches last saw it,
    less the consumer's position, plus the decisions fetched but not yet handled
    (``in_hand``)."""
    while True:
        await asyncio.sleep(_LAG_INTERVAL_S)
        lags: dict[int, int] = {}
        for tp in consumer.assignment():
            end = consumer.highwater(tp)
            if end is None:
                continue
            try:
                position = await consumer.position(tp)
            except IllegalStateError:  # revoked by a rebalance meanwhile
                continue
            lags[tp.partition] = max(0, end - position + in_hand.get(tp, 0))
        metrics.set_lag(lags)


async def _handle(actuator: Actuator, value: bytes) -> None:
    try:
        decision = Decision.from_json(value)
    except (RecordError, TypeError) as exc:
        log.warning("slurm actuator: skipping a record that is no decision: %s", exc)
        return
    # scontrol blocks (and the settle wait sleeps): off the event loop, so heartbeats go on.
    await asyncio.to_thread(actuator.apply, decision)
