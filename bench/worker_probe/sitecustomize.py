"""What a benchmarked worker spends outside its own code: the cyclic garbage collector's time
per generation, and the Kafka requests its clients send, by type (docs/pipeline-bench.md,
finding 22). Python loads this module at start-up when its folder is on PYTHONPATH; it acts
only in a worker's main process (not in the model and reader processes it spawns) and only
when ``SIBYLLA_PROBE_OUT`` names a file, to which it appends one JSON line a second::

    python bench/bench_pipeline.py --broker kafka --quick --phases decisions --worker-command \\
        "env PYTHONPATH=$PWD/bench/worker_probe SIBYLLA_PROBE_OUT=/tmp/probe.jsonl \\
         python3 -m sibylla worker"

Each line: seconds since the worker started, its CPU seconds, the seconds spent in and the
number of collections of each generation, and the requests sent so far per type. Rates come
from differences between lines.
"""

from __future__ import annotations

import gc
import os
import threading
import time
from collections import Counter
from typing import Any

import orjson

_OUT = os.environ.get("SIBYLLA_PROBE_OUT", "")
with open("/proc/self/cmdline", "rb") as _cmdline:
    _ARGV = _cmdline.read().split(b"\0")
_WORKER = b"sibylla" in _ARGV and b"worker" in _ARGV


def _count_collections() -> tuple[list[float], list[int]]:
    spent, counts = [0.0, 0.0, 0.0], [0, 0, 0]
    started = [0.0]

    def on_collection(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            spent[info["generation"]] += time.perf_counter() - started[0]
            counts[info["generation"]] += 1
    gc.callbacks.append(on_collection)
    return spent, counts


def _count_requests() -> Counter[str]:
    from aiokafka.conn import AIOKafkaConnection

    sent: Counter[str] = Counter()
    send = AIOKafkaConnection.send

    def counted(self: Any, request: Any, *args: Any, **kwargs: Any) -> Any:
        sent[type(request).__name__.split("_")[0]] += 1
        return send(self, request, *args, **kwargs)
    AIOKafkaConnection.send = counted  # type: ignore[method-assign]
    return sent


def _write_every_second(spent: list[float], counts: list[int], sent: Counter[str]) -> None:
    began = time.monotonic()
    while True:
        time.sleep(1.0)
        line = {"t": round(time.monotonic() - began, 1), "cpu_s": time.process_time(),
                "gc_s": spent, "collections": counts, "requests": dict(sent)}
        with open(_OUT, "ab") as out:
            out.write(orjson.dumps(line) + b"\n")


if _OUT and _WORKER:
    _spent, _counts = _count_collections()
    threading.Thread(target=_write_every_second, args=(_spent, _counts, _count_requests()),
                     name="sibylla-probe", daemon=True).start()
