"""Table keys and partitions of job attempts.

Every topic Sibylla reads is keyed by job_id and has the same partition count, and its tables
use the same partitions for their changelogs, so one worker holds everything about a job.
Table keys name the attempt as ``"<attempt>:<job_id>"``: the attempt first, because a job_id
may contain any character but an attempt number never contains a colon.
"""

from __future__ import annotations

import functools

from aiokafka.partitioner import murmur2

__all__ = ["attempt_key", "key_text", "partition_of", "split_key"]


def attempt_key(job_id: str, attempt: int) -> str:
    return f"{attempt}:{job_id}"


def key_text(key: str | bytes) -> str:
    """A table key as text: the tables declare ``bytes`` keys (their changelogs keep them raw)
    and RocksDB gives them back so, while the worker writes them as str."""
    return key.decode() if isinstance(key, bytes) else key


def split_key(key: str) -> tuple[str, int]:
    """Inverse of :func:`attempt_key`."""
    attempt, _, job_id = key.partition(":")
    return job_id, int(attempt)


@functools.lru_cache(maxsize=1 << 16)  # pure, and asked again for the same jobs by every sweep
def partition_of(job_id: str, partitions: int) -> int:
    """The partition Kafka's default partitioner (murmur2, as in the Java client and aiokafka)
    gives a record keyed by ``job_id``. Producers must use it for co-partitioning; librdkafka
    shippers need ``partitioner=murmur2_random``."""
    return (murmur2(job_id.encode()) & 0x7FFFFFFF) % partitions
