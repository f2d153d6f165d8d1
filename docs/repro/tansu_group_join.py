"""Minimal reproduction: on Tansu 0.6.0 a consumer's first join of a group takes 3 s, whatever
the rebalance timeout it asks for.

    python docs/repro/tansu_group_join.py tansu    # 3.0 s for every timeout
    python docs/repro/tansu_group_join.py kafka    # test broker (initial delay 0): under 1 s

A consumer joins a new group on a four-partition topic; the time from start() to its first
assignment is printed for several rebalance timeouts. Apache Kafka holds a new group's first
join for group.initial.rebalance.delay.ms (3 s by default; deploy/kafka sets 0). See
docs/brokers.md.
"""

import asyncio
import time

from against import run_against_named_broker  # docs/repro/against.py
from aiokafka import AIOKafkaConsumer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

TOPIC = "repro"
REBALANCE_TIMEOUTS_MS = (500, 1000, 3000, 10000)


async def join_seconds(bootstrap: str, group: str, rebalance_timeout_ms: int) -> float:
    consumer = AIOKafkaConsumer(TOPIC, bootstrap_servers=bootstrap, group_id=group,
                                rebalance_timeout_ms=rebalance_timeout_ms,
                                session_timeout_ms=6000, heartbeat_interval_ms=1000)
    started = time.monotonic()
    await consumer.start()
    while not consumer.assignment():
        await asyncio.sleep(0.01)
    took = time.monotonic() - started
    await consumer.stop()
    return took


async def probe(bootstrap: str) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    await admin.create_topics([NewTopic(TOPIC, 4, 1)])
    await admin.close()
    for n, timeout_ms in enumerate(REBALANCE_TIMEOUTS_MS):
        took = await join_seconds(bootstrap, f"group-{n}", timeout_ms)
        print(f"rebalance timeout {timeout_ms} ms: first assignment after {took:.2f} s")


if __name__ == "__main__":
    run_against_named_broker(probe)
