"""The worker side of online learning: votes in, labels out, announced models swapped in.

Registered on a worker's pipeline by :func:`register` (``streams/worker.py`` calls it):

    decide path ──(decided hook)──► votes table: window text, signature, committee votes;
                                    a failed retry votes on the previous attempt
    job-events ──► outcomes agent ──► votes table: a COMPLETED retry votes on the previous one
    POST /labels/... (bearer token) ─► label-votes ─► operator_votes agent ─► votes table
                         └──────── majority reached ──► sibylla.labels
    sibylla.models (every partition, no group) ──► watcher: signature, sequence, model root,
                                                   checksum; load, swap

The votes table is keyed by attempt and co-partitioned with the job topics, so the decided
hook (in the job's partition's context), the outcomes agent and the operator agent all write the
job's partition and its changelog: the votes survive restarts and rebalances. The models topic
is read by every worker without a consumer group: each worker must see every announcement.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, TopicPartition
from faust.web import Request, Response, View

from sibylla.inference.api import Classifier, Prediction
from sibylla.schemas.records import ModelAnnouncement, RecordError, parse_job_event
from sibylla.settings import SettingsError
from sibylla.streams import bulk
from sibylla.streams.agents import Decided, Pipeline
from sibylla.streams.app import RAW, raw_table
from sibylla.streams.keys import attempt_key
from sibylla.streams.state import live_get, live_items_of

from .announce import AnnouncementError, verify
from .committee import build_committee
from .metrics import VoteMetrics
from .operators import DISABLED, OperatorAuthError, OperatorTokens
from .settings import OnlineSettings
from .signing import SigningKeyError
from .trust import AnnouncementGuard
from .votes import (
    OUTCOME,
    AttemptRecord,
    committee_votes,
    operator_request,
    operator_vote,
    outcome_vote,
    parse_operator_request,
)

__all__ = ["PRIMARY", "OnlineLearning", "register"]

log = logging.getLogger(__name__)

PRIMARY = "primary"  # committee name of the model that made the decision
SWEEP_EVERY_S = 600.0  # how often a partition's expired votes are looked for
OUTCOMES_BATCH = 512  # job events per batch of the outcomes agent
SEQUENCE_FILE = "model-sequence.json"  # in the worker's data_dir (trust.SequenceFile)


class OnlineLearning:
    """Tables, topics, agents and pages of the loop on one worker (see module docstring)."""

    def __init__(self, pipeline: Pipeline, settings: OnlineSettings,
                 committee: Mapping[str, Classifier]) -> None:
        self.p = pipeline
        self.s = settings
        self.committee = dict(committee)
        self.rule = settings.vote_rule()
        ws = pipeline.settings
        app = pipeline.t.app
        self.votes = raw_table(app, ws, "votes")
        self.label_votes = app.topic(ws.topic("label-votes"), internal=True,
                                     partitions=ws.partitions, **RAW)
        self.metrics = VoteMetrics(pipeline.metrics.registry)
        self._last_sweep: dict[int, float] = {}
        try:
            self.guard = AnnouncementGuard(settings, ws.data_dir / SEQUENCE_FILE)
        except SigningKeyError as exc:
            raise SettingsError(f"model_public_key: {exc}") from None
        self.roots = settings.roots()
        try:
            self.operators = (OperatorTokens.from_file(settings.operator_tokens_file)
                              if settings.operator_tokens_file else None)
        except OSError as exc:
            raise SettingsError(f"operator_tokens_file: {settings.operator_tokens_file}: "
                                f"{exc.strerror}") from None
        except ValueError as exc:
            raise SettingsError(f"operator_tokens_file: {exc}") from None

    def register(self) -> None:
        app = self.p.t.app
        self.p.decided_hooks.append(self.on_decided)
        app.agent(self.p.t.job_events, name="outcomes", isolated_partitions=True)(self._outcomes)
        app.agent(self.label_votes, name="operator_votes", isolated_partitions=True)(
            self._operator_votes)
        app.task(self._watch_models)
        self._register_page()

    # ---------------------------------------------------------------- votes table
    def _get(self, job_id: str, attempt: int) -> AttemptRecord | None:
        raw = live_get(self.votes, attempt_key(job_id, attempt))
        return AttemptRecord.from_bytes(raw) if raw is not None else None

    async def _put(self, record: AttemptRecord) -> None:
        """Store ``record``, publishing its label first when the majority changed."""
        label = record.label_due(self.rule)
        if label is not None:
            await self.p.t.labels.send(key=record.job_id.encode(), value=label.to_json(),
                                       force=True)
            self.metrics.labels.labels(label=label.label).inc()
            record = replace(record, published=label.label)
        self.votes[attempt_key(record.job_id, record.attempt)] = record.to_bytes()

    # ---------------------------------------------------------------- decided hook
    async def on_decided(self, decided: Sequence[Decided]) -> None:
        """Keep each window's text and the committee's votes; a failed retry votes on its
        parent. ``decided``: one decide batch, so that each member predicts once per batch (a
        thread hop per window and member made this a third of the decide path's time), each
        window with its reading (the redacted text and error signature kept here)."""
        shown = [i for i, (window, _, _) in enumerate(decided) if not window.empty]
        votes_of: dict[str, dict[int, Prediction]] = {}
        if shown:
            for name, model in self.committee.items():
                found = await asyncio.to_thread(model.predict, [decided[i][0] for i in shown])
                votes_of[name] = dict(zip(shown, found, strict=True))
        for i, (_, decision, reading) in enumerate(decided):
            predictions = {PRIMARY: Prediction(decision.verdict, decision.confidence,
                                               decision.category, [])}
            predictions.update((name, found[i]) for name, found in votes_of.items()
                               if i in found)
            record = self._get(decision.job_id, decision.attempt) or AttemptRecord(
                decision.job_id, decision.attempt, created_at=time.time())
            record = replace(record, log=reading.text, category=decision.category,
                             signature=reading.signature, decided=True)
            for vote in committee_votes(predictions, self.rule):
                record = record.with_vote(vote)
                self.metrics.votes.labels(kind="committee").inc()
            await self._put(record)
            if decision.attempt > 0:
                await self._outcome(decision.job_id, decision.attempt - 1, False,
                                    record.signature)

    async def _outcome(self, job_id: str, attempt: int, completed: bool,
                       next_signature: str | None) -> None:
        previous = self._get(job_id, attempt)
        if previous is None or not previous.decided or OUTCOME in previous.votes:
            return  # not a decided failure here, or its retry already voted
        vote = outcome_vote(previous.signature, completed, next_signature, self.rule)
        if vote is not None:
            self.metrics.votes.labels(kind="outcome").inc()
            await self._put(previous.with_vote(vote))

    # ---------------------------------------------------------------- agents
    async def _outcomes(self, stream: Any) -> None:
        """A retry that COMPLETED proves its parent's failure transient."""
        await bulk.consume(stream, self._outcomes_batch, OUTCOMES_BATCH, within_s=0.0)

    async def _outcomes_batch(self, events: Sequence[Any]) -> None:
        for event in events:
            try:
                job = parse_job_event(event.message.value)
            except RecordError:
                continue  # the terminations agent dead-letters it
            if job.event == "finished" and job.state == "COMPLETED" and job.attempt > 0:
                self.p.in_event(event)
                await self._outcome(job.job_id, job.attempt - 1, True, None)
        event = events[-1]
        partition, now = event.message.partition, time.time()
        if now - self._last_sweep.get(partition, 0.0) > SWEEP_EVERY_S:
            self._last_sweep[partition] = now
            self.p.in_event(event)
            self.expire(partition, now)

    def expire(self, partition: int, now: float) -> int:
        """Drop the votes of this partition's attempts older than the TTL (in an event of
        that partition, so the deletions reach its changelog); returns how many."""
        horizon, partitions = now - self.s.votes_ttl_s, self.p.settings.partitions
        old = [key for key, value in live_items_of(self.votes, partition, partitions)
               if AttemptRecord.from_bytes(value).created_at < horizon]
        for key in old:
            del self.votes[key]
        return len(old)

    async def _operator_votes(self, stream: Any) -> None:
        async for event in stream.events():
            try:
                job_id, attempt, label, by = parse_operator_request(event.message.value)
            except RecordError as exc:
                log.warning("bad operator label %r: %s", event.message.value[:200], exc)
                continue
            self.p.in_event(event)
            record = self._get(job_id, attempt) or AttemptRecord(job_id, attempt,
                                                                 created_at=time.time())
            self.metrics.votes.labels(kind="operator").inc()
            await self._put(record.with_vote(operator_vote(label, self.rule, by)))

    # ---------------------------------------------------------------- HTTP
    def operator(self, authorization: str | None) -> str:
        """The operator a request's Authorization header names (operators.py);
        :class:`OperatorAuthError` (counted, logged without the token) otherwise."""
        try:
            if self.operators is None:
                raise DISABLED
            return self.operators.operator(authorization)
        except OperatorAuthError as exc:
            self.metrics.operator_refused.labels(reason=exc.reason).inc()
            log.warning("operator label refused (%d %s)", exc.status, exc.reason)
            raise

    def _register_page(self) -> None:
        topic, loop = self.label_votes, self

        class LabelPage(View):
            """POST /labels/{job_id}/{attempt} {"label": "deterministic"} with an operator's
            bearer token: an operator's vote (queued on the label-votes topic, so any worker
            can take it)."""

            async def post(self, request: Request, job_id: str, attempt: str) -> Response:
                try:
                    operator = loop.operator(request.headers.get("Authorization"))
                except OperatorAuthError as exc:
                    headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else None
                    return self.json({"error": exc.message}, status=exc.status,
                                     headers=headers)
                try:
                    body = await request.json()
                    value = operator_request(job_id, int(attempt), body.get("label"), operator)
                    parse_operator_request(value)
                except (ValueError, AttributeError, RecordError) as exc:
                    return self.json({"error": str(exc)}, status=400)
                await topic.send(key=job_id.encode(), value=value, force=True)
                return self.json({"queued": orjson.loads(value)}, status=202)

        self.p.t.app.page("/labels/{job_id}/{attempt}")(LabelPage)

    # ---------------------------------------------------------------- model watcher
    async def _watch_models(self) -> None:
        """Follow sibylla.models from its start (compacted: the latest model per name)."""
        ws = self.p.settings
        topic = ws.topic("models")
        consumer = AIOKafkaConsumer(bootstrap_servers=ws.bootstrap_servers, group_id=None,
                                    enable_auto_commit=False, **ws.kafka_client_options())
        await consumer.start()
        try:
            await consumer.topics()  # load metadata: the topic may be new to this client
            partitions = consumer.partitions_for_topic(topic) or {0}
            tps = [TopicPartition(topic, p) for p in sorted(partitions)]
            consumer.assign(tps)
            await consumer.seek_to_beginning(*tps)
            for value in await _latest_per_key(consumer, tps):
                await self.on_announcement(value)
            async for msg in consumer:
                await self.on_announcement(msg.value)
        finally:
            await consumer.stop()

    async def on_announcement(self, value: bytes) -> bool:
        """Swap in an announced model once its signature, sequence, location, checksum and
        version check out (trust.py, announce.py); each refusal is logged once and counted
        by reason."""
        try:
            ann = self.guard.admit(value)
            if ann.name != self.s.model_name:
                return False
            self.metrics.set_announced(ann.version)  # only announcements that check out
            if ann.version == (await self.p.model()).version:
                # The model it runs, announced again (a worker restarted reads the compacted
                # topic from its start): its gate scores are now known.
                self.guard.accepted(ann)
                self.p.activity.set_scores(ann.metrics)
                return False
            classifier = await self._load(ann)
        except AnnouncementError as exc:
            log.error("model announcement refused (%s): %s", exc.reason, exc)
            self.metrics.rejected.labels(reason=exc.reason).inc()
            return False
        self.guard.accepted(ann)
        self.p.swap_classifier(classifier, ann.metrics)
        self.metrics.swaps.inc()
        log.info("swapped in model %s (sequence %d, announced %s)", ann.version, ann.sequence,
                 ann.metrics)
        return True

    async def _load(self, ann: ModelAnnouncement) -> Classifier:
        """The announced model, from a file inside the model roots with the right checksum."""
        from sibylla.inference.remote import ProcessClassifier

        ws = self.p.settings
        path = await asyncio.to_thread(verify, ann, self.roots)
        try:
            classifier = await asyncio.to_thread(ProcessClassifier, str(path), ws.device,
                                                 ws.min_confidence, ws.cpu_threads)
        except Exception as exc:  # noqa: BLE001 - a bad file must not stop the worker
            raise AnnouncementError("unloadable", f"model {ann.version}: {exc}") from None
        if classifier.version != ann.version:
            await asyncio.to_thread(classifier.close)
            raise AnnouncementError("wrong_version", f"file holds model {classifier.version}, "
                                    f"announced {ann.version}")
        return classifier


async def _latest_per_key(consumer: AIOKafkaConsumer, tps: list[TopicPartition]
                          ) -> list[bytes]:
    """The records on ``tps`` when the worker starts, the last one per key only (what
    compaction keeps; the broker may not have compacted yet), then any that came meanwhile.

    Older announcements of a key are history, not replays: a restarted worker must neither
    load each of them in turn nor refuse (and count) them as replays of its newest one.
    """
    ends = await consumer.end_offsets(tps)
    latest: dict[bytes | None, bytes] = {}
    newer: list[bytes] = []
    pending = {tp for tp in tps if ends[tp] > await consumer.position(tp)}
    while pending:
        for tp, records in (await consumer.getmany(*pending, timeout_ms=1000)).items():
            for msg in records:
                if msg.offset < ends[tp]:
                    latest.pop(msg.key, None)  # keep the order of the last records
                    latest[msg.key] = msg.value
                else:
                    newer.append(msg.value)
        pending = {tp for tp in pending if await consumer.position(tp) < ends[tp]}
    return [*latest.values(), *newer]


def register(pipeline: Pipeline, committee: Mapping[str, Classifier] | None = None,
             settings: OnlineSettings | None = None) -> OnlineLearning:
    """Add online learning to a worker's pipeline (before the app starts).

    ``committee``: extra models (name -> classifier) whose verdicts vote beside the decision's
    (built from ``settings.committee`` when not given);
    ``settings``: from ``SIBYLLA_*`` variables when not given.
    """
    settings = settings or OnlineSettings.from_env()
    if committee is None:
        committee = build_committee(settings.committee, pipeline.settings.device)
    loop = OnlineLearning(pipeline, settings, committee)
    loop.register()
    return loop
