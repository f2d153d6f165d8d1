"""The trainer process (``sibylla trainer``): Kafka around :class:`Trainer`.

It runs apart from the inference workers so that a fine-tune never stalls a decision. It reads
``sibylla.labels`` from the beginning without a consumer group: a restarted trainer rebuilds
its replay buffer and held-back labels from the topic, and labels older than the current
model's training data count as replay, not as new. A fine-tune runs in a thread; a promoted
model is written to the models directory and announced on ``sibylla.models`` (keyed by the
model name, compacted: the topic always holds the one model every worker should run).
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Sequence

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from sibylla.inference.checkpoint import load_checkpoint
from sibylla.inference.corpus import HELD_OUT_FILE, TRAIN_FILES, load_records, packaged_path
from sibylla.inference.synthetic import generate
from sibylla.inference.train import Example, examples_from_records
from sibylla.schemas.records import Label
from sibylla.settings import Settings, SettingsError
from sibylla.streams.topics import ensure_topics

from .announce import announcement
from .settings import OnlineSettings
from .signing import SigningKeyError, load_private_key
from .store import ModelEntry, ModelStore
from .trainer import Trainer

__all__ = ["announce", "replay_seed", "run_trainer", "signing_key"]

log = logging.getLogger(__name__)

SEED_SYNTHETIC = 400  # generated logs seeding the replay buffer beside the real logs of file a
POLL_MS = 1000


def replay_seed(seed: int = 0) -> list[Example]:
    """Examples like the base model's training data, so the first fine-tunes replay more than
    the stream's own lopsided labels: the first real training file (85 logs, the seed's size
    before the base model trained on more) and some generated logs."""
    records = load_records(packaged_path(TRAIN_FILES[0])) + generate(SEED_SYNTHETIC, seed=seed)
    random.Random(seed).shuffle(records)
    return examples_from_records(records)


def signing_key(online: OnlineSettings) -> Ed25519PrivateKey | None:
    """The trainer's signing key (None, with a warning, when none is configured)."""
    if not online.model_signing_key:
        log.warning("no SIBYLLA_MODEL_SIGNING_KEY: model announcements go out unsigned, and "
                    "workers refuse them unless SIBYLLA_ALLOW_UNSIGNED_MODELS is on")
        return None
    try:
        return load_private_key(online.model_signing_key)
    except SigningKeyError as exc:
        raise SettingsError(f"model_signing_key: {exc}") from None


async def announce(settings: Settings, online: OnlineSettings, store: ModelStore,
                   entry: ModelEntry, key: Ed25519PrivateKey | None,
                   producer: AIOKafkaProducer | None = None) -> None:
    """Publish ``entry`` on sibylla.models with the next sequence number, signed with ``key``
    (workers check the signature, the sequence and the checksum, and swap it in)."""
    ann = announcement(online.model_name, entry.version, store.path(entry), entry.sha256,
                       entry.scores, store.next_sequence(), key)
    own = producer is None
    if producer is None:
        producer = AIOKafkaProducer(bootstrap_servers=settings.bootstrap_servers,
                                    **settings.kafka_client_options())
        await producer.start()
    try:
        await producer.send_and_wait(settings.topic("models"), key=online.model_name.encode(),
                                     value=ann.to_json())
        log.info("announced model %s (%s, sequence %d, %s)", entry.version, ann.uri,
                 ann.sequence, "signed" if ann.signature else "unsigned")
    finally:
        if own:
            await producer.stop()


async def run_trainer(settings: Settings, online: OnlineSettings,
                      real_validation: Sequence[Example] | None = None) -> None:
    """Consume labels forever, fine-tuning and promoting as they come.

    ``real_validation``: the gate's ``real`` part; the held-out real logs when not given (the
    demo passes those it does not replay, so that no log it labels also judges the model).
    """
    key = signing_key(online)
    await ensure_topics(settings)
    store = ModelStore(online.models_dir)
    base = load_checkpoint(settings.model_path or None)
    if real_validation is None:
        real_validation = examples_from_records(load_records(packaged_path(HELD_OUT_FILE)))
    trainer = Trainer(online, store, base, real_validation, replay_seed())
    if online.trainer_metrics_port:
        from prometheus_client import start_http_server

        start_http_server(online.trainer_metrics_port, registry=trainer.metrics.registry)
    producer = AIOKafkaProducer(bootstrap_servers=settings.bootstrap_servers,
                                **settings.kafka_client_options())
    consumer = AIOKafkaConsumer(bootstrap_servers=settings.bootstrap_servers, group_id=None,
                                enable_auto_commit=False, **settings.kafka_client_options())
    await producer.start()
    await consumer.start()
    try:
        current = store.current
        if current is not None:  # workers converge on it even if the topic was recreated
            await announce(settings, online, store, current, key, producer)
        topic = settings.topic("labels")
        # Every partition of the topic (co-partitioned: settings.partitions of them); asking
        # the consumer's metadata right after start can miss a topic it has not fetched yet.
        tps = [TopicPartition(topic, p) for p in range(settings.partitions)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        log.info("trainer running: model %s, models in %s", trainer.classifier.version,
                 online.models_dir)
        while True:
            batches = await consumer.getmany(timeout_ms=POLL_MS)
            for records in batches.values():
                for record in records:
                    try:
                        trainer.add_label(Label.from_json(record.value))
                    except (ValueError, TypeError, KeyError) as exc:
                        log.warning("skipping unreadable label at %s: %s", record.offset, exc)
            trigger = trainer.due()
            if trigger is None:
                continue
            report = await asyncio.to_thread(trainer.step, trigger)
            if report.result.promote:
                await announce(settings, online, store, store.get(report.version), key,
                               producer)
    finally:
        await consumer.stop()
        await producer.stop()
