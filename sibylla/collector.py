"""The cyclic garbage collector's settings for Sibylla's long-running processes.

CPython runs a young collection every 700 net allocations of container objects, and with every
tenth of those a middle one, and now and then a full one that walks every tracked object: the
modules, classes and services a process made at start-up and keeps to its end. A worker taking
one-line records spent 1.3-1.5 s of its ~9.5 s of CPU in 1,741 young, 157 middle and 20 full
collections (gc.callbacks; docs/pipeline-bench.md, finding 22). What it makes while it runs
(records, windows, strings) is freed by reference counting; few of those objects form cycles.

:func:`tune_collector`, once a process has started, moves every object then alive into the
permanent generation, which no collection walks (``gc.freeze``), and collects the young
generation every :data:`YOUNG_COLLECTION_EVERY` allocations: 0.4-0.6 s of collections in the
same run, each pause a few ms.
"""

from __future__ import annotations

import gc

__all__ = ["YOUNG_COLLECTION_EVERY", "tune_collector"]

# Net allocations between young collections (CPython's default: 700). At 50,000 the collections
# cost as little in all, but each paused the process ~27 ms, a quarter of a lone failure's
# decision budget; at 10,000 a pause is ~3 ms.
YOUNG_COLLECTION_EVERY = 10_000


def tune_collector() -> None:
    """Call once the process's start-up objects exist (imports done, services built): freezes
    what is alive and spaces the collections out. No collection first: start-up leaves almost
    no cyclic garbage to free (10 objects in the worker, 40 in the model's process), and one
    took 23 and 65 ms there, on the way to the first decision."""
    gc.freeze()
    gc.set_threshold(YOUNG_COLLECTION_EVERY, 20, 10)
