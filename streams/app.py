"""The faust app of a worker: topics and tables, built from :class:`Settings`.

Every topic a worker consumes, and every table changelog, has ``settings.partitions``
partitions and is keyed by job_id, so faust's co-partitioning assignor hands one worker all the
state of a job: its log window, its pending termination, its decision.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import faust

from sibylla.settings import Settings
from sibylla.streams import stores
from sibylla.streams.bulk import BulkTopic
from sibylla.streams.fastpath import SibyllaApp

__all__ = ["Topology", "build_app", "raw_table"]

RAW: dict[str, Any] = {"key_serializer": "raw", "value_serializer": "raw"}


@dataclass
class Topology:
    """The app with its topics and tables; the agents module registers agents on it."""

    settings: Settings
    app: SibyllaApp
    logs: Any
    job_events: Any
    decisions: Any
    deadletter: Any
    labels: Any
    windows: Any  # attempt key -> window header (see window_store)
    window_chunks: Any  # attempt key#n -> lines of chunk n
    pending: Any  # attempt key -> pending termination (JSON)
    decided: Any  # attempt key -> Decision JSON
    offsets: Any  # "<topic>/<partition>" -> last offset an agent finished (see gaps.py)
    history: Any  # job_id -> the job's failed attempts, for the policy with memory (JSON)


def _credentials(settings: Settings) -> Any:
    opts = settings.kafka_client_options()
    if settings.security_protocol.startswith("SASL"):
        return faust.SASLCredentials(
            username=settings.sasl_username,
            password=settings.sasl_password,
            mechanism=settings.sasl_mechanism,
            ssl_context=opts.get("ssl_context"),
        )
    if settings.security_protocol == "SSL":
        return faust.SSLCredentials(opts["ssl_context"])
    return None


def raw_table(app: Any, settings: Settings, name: str) -> Any:
    """A changelog-backed table of raw bytes, partitioned like the job topics. Its name must be
    in ``topics.TABLES`` (the changelog is created before the worker starts)."""
    # The store picks its serializer from value_type (not from the schema): bytes keeps values
    # raw in the RocksDB store too.
    return app.Table(name, partitions=settings.partitions, key_type=bytes, value_type=bytes,
                     schema=faust.Schema(**RAW))


def build_app(settings: Settings) -> Topology:
    """The app, topics and tables of a worker (no agents yet)."""
    store = f"{stores.MEMORY_SCHEME if settings.store == 'memory' else stores.SCHEME}://"
    app = SibyllaApp(
        settings.group_id,
        broker=settings.broker_url,
        broker_credentials=_credentials(settings),
        store=store,
        datadir=str(settings.data_dir),
        topic_partitions=settings.partitions,
        topic_replication_factor=settings.replication_factor,
        consumer_auto_offset_reset="earliest",
        processing_guarantee="at_least_once",
        # A dead worker's partitions move after the session timeout; a short rebalance
        # timeout keeps the group join to seconds (brokers may hold a join up to it).
        broker_session_timeout=settings.session_timeout_ms / 1000.0,
        broker_heartbeat_interval=max(0.5, settings.session_timeout_ms / 6000.0),
        broker_rebalance_timeout=max(settings.session_timeout_ms / 1000.0 * 2, 10.0),
        broker_commit_interval=1.0,
        # Commits on that timer: each saves the windows changed since the last (agents.py), and
        # faust's default of a commit every 10,000 records made that three times a second at
        # ingest speed. This count only bounds a replay at rates the timer cannot.
        broker_commit_every=200_000,
        producer_linger=0.005,
        producer_max_request_size=4 * 1024 * 1024,
        stream_buffer_maxsize=8192,
        web_enabled=True,
        web_bind=settings.web_host,
        web_port=settings.web_port,
        web_in_thread=False,
        table_cleanup_interval=60.0,
    )
    t = settings.topic
    part = {"partitions": settings.partitions}
    def bulk_topic(name: str, **kwargs: Any) -> BulkTopic:
        """A topic the agents read in batches, a fetch at a time (bulk.py)."""
        app.bulk_topics.add(name)
        return BulkTopic(app, topics=[name], **RAW, **part, **kwargs)

    logs = bulk_topic(t("logs"))
    job_events = bulk_topic(t("job-events"))
    decisions = app.topic(t("decisions"), **RAW, **part)
    deadletter = app.topic(t("deadletter"), **RAW)
    labels = app.topic(t("labels"), **RAW, **part)

    def table(name: str) -> Any:
        return raw_table(app, settings, name)

    return Topology(
        settings=settings, app=app, logs=logs, job_events=job_events,
        decisions=decisions, deadletter=deadletter,
        labels=labels, windows=table("windows"), window_chunks=table("window-chunks"),
        pending=table("pending"),
        decided=table("decided"), offsets=table("offsets"),
        history=table("history"),
    )
