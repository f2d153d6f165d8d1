"""Creating the contract's topics with the partition counts co-partitioning needs.

Brokers that auto-create topics would give ``sibylla.logs`` and ``sibylla.job-events`` the
broker's default partition count, which may differ from each other or from the tables'
changelogs; then a job's log window and its termination land on different workers. So the
worker, the shipper and the demo create them explicitly, and a worker refuses to start when an
existing topic has the wrong count.
"""

from __future__ import annotations

import asyncio
import logging
import time

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import (
    KafkaConnectionError,
    KafkaError,
    KafkaTimeoutError,
    TopicAlreadyExistsError,
)

from sibylla.settings import Settings, SettingsError

__all__ = ["COPARTITIONED", "broker_answers", "changelog_topic", "ensure_topics",
           "transient_broker_error"]

log = logging.getLogger(__name__)

# Topics keyed by job_id that must share the partition count. The internal one (label-votes) is
# created here too: left to faust, a topic created moments before the group's
# first assignment can be missing from the broker's metadata, and faust's assignor then skips
# it ("Ignoring missing topic") until a later rebalance: no decisions meanwhile (seen on Kafka).
COPARTITIONED = ("logs", "job-events", "decisions", "labels", "label-votes")
# The worker's tables (faust names their changelogs "<group>-<table>-changelog"). Created here for
# the same reason; faust also reported a just-created changelog with no partitions yet and
# stopped the agent that wrote to it ("PartitionsMismatch").
TABLES = ("windows", "window-chunks", "pending", "decided", "history", "votes",
          "offsets")
SETTLE_S = 30.0  # longest wait for the broker's metadata to show every partition


def changelog_topic(settings: Settings, table: str) -> str:
    """The changelog topic faust gives a worker's table."""
    return f"{settings.group_id}-{table}-changelog"


def _admin(settings: Settings) -> AIOKafkaAdminClient:
    """An admin client for the broker (not started)."""
    return AIOKafkaAdminClient(bootstrap_servers=settings.bootstrap_servers,
                               **settings.kafka_client_options())


async def broker_answers(settings: Settings) -> bool:
    """Does the broker answer now (one try)?"""
    admin = _admin(settings)
    try:
        await admin.start()
    except KafkaConnectionError:
        return False
    finally:
        await admin.close()
    return True


def transient_broker_error(exc: BaseException) -> bool:
    """Is ``exc`` a broker not answering, going away or not ready yet (worth trying again),
    rather than a refusal that trying again cannot change?"""
    return isinstance(exc, TimeoutError | KafkaTimeoutError) or (
        isinstance(exc, KafkaError) and exc.retriable)


async def ensure_topics(settings: Settings, wait_s: float = 0.0) -> None:
    """Create missing topics; check partition counts of the co-partitioned ones. ``wait_s``:
    how long to keep trying while the broker does not answer yet, or goes away during the
    check (a worker restarted while the broker restarts met both in the fault campaign)."""
    deadline = time.monotonic() + wait_s
    while True:
        admin = _admin(settings)
        try:
            await admin.start()
            await _create_and_check(admin, settings)
            return
        except (KafkaError, TimeoutError) as exc:
            if not transient_broker_error(exc) or time.monotonic() > deadline:
                raise
            log.warning("broker %s does not answer or went away (%r); retrying",
                        settings.bootstrap_servers, exc)
        finally:
            await admin.close()
        await asyncio.sleep(1.0)


async def _create_and_check(admin: AIOKafkaAdminClient, settings: Settings) -> None:
    """One pass of :func:`ensure_topics` over a connected admin client."""
    wanted = [NewTopic(settings.topic(n), settings.partitions, settings.replication_factor)
              for n in COPARTITIONED]
    wanted.append(NewTopic(settings.topic("deadletter"), 1, settings.replication_factor))
    wanted.append(NewTopic(settings.topic("models"), 1, settings.replication_factor,
                           topic_configs={"cleanup.policy": "compact"}))
    wanted += [NewTopic(changelog_topic(settings, t), settings.partitions,
                        settings.replication_factor,
                        topic_configs={"cleanup.policy": "compact"}) for t in TABLES]
    existing = set(await admin.list_topics())
    missing = [t for t in wanted if t.name not in existing]
    for topic in missing:
        try:
            await admin.create_topics([topic])
            log.info("created topic %s (%d partitions)", topic.name, topic.num_partitions)
        except TopicAlreadyExistsError:
            pass
    names = [t.name for t in wanted if t.num_partitions == settings.partitions]
    deadline = time.monotonic() + SETTLE_S
    while True:
        counts = {info["topic"]: len(info.get("partitions", []))
                  for info in await admin.describe_topics(names)}
        for name, count in counts.items():
            if count and count != settings.partitions:
                raise SettingsError(
                    f"partitions: topic {name} has {count} partitions, Sibylla is "
                    f"configured for {settings.partitions}; they must match "
                    "(co-partitioning)")
        if all(counts.get(n) for n in names) or time.monotonic() > deadline:
            return
        await asyncio.sleep(0.2)  # created, not yet in the metadata
