"""Minimal reproduction: Tansu 0.6.0 reports a partition's end offset as the base offset of
its last record batch + 1, not the offset of its last record + 1.

    python docs/repro/tansu_end_offset.py tansu    # end offset 1, five records readable
    python docs/repro/tansu_end_offset.py kafka    # end offset 5 (Apache Kafka, the reference)

One produce request carries one batch of five records; then ListOffsets (latest) is asked
and the records are read back. See docs/brokers.md for what this breaks.
"""


from against import run_against_named_broker  # docs/repro/against.py
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

TOPIC = "repro"


async def probe(bootstrap: str) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    await admin.create_topics([NewTopic(TOPIC, 1, 1)])
    await admin.close()

    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    batch = producer.create_batch()
    for i in range(5):
        batch.append(key=b"k", value=f"v{i}".encode(), timestamp=None)
    await (await producer.send_batch(batch, TOPIC, partition=0))
    await producer.stop()

    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap)
    await consumer.start()
    tp = TopicPartition(TOPIC, 0)
    print("end offset after one batch of 5 records:", (await consumer.end_offsets([tp]))[tp])
    consumer.assign([tp])
    await consumer.seek_to_beginning(tp)
    records = (await consumer.getmany(tp, timeout_ms=3000)).get(tp, [])
    print("offsets read back:", [r.offset for r in records])
    await consumer.stop()


if __name__ == "__main__":
    run_against_named_broker(probe)
