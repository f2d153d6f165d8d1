"""``sibylla demo``: the whole path on one machine, with nothing installed beforehand.

Starts Tansu (unless bootstrap servers are configured) and a worker, replays bundled real
failed-job logs the way a shipper and a scheduler hook would, prints each decision as it comes,
and exits 0 once every job is decided.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
import sys
import tempfile
import time
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path

from sibylla.brokers.launchers import tansu
from sibylla.brokers.process import free_port
from sibylla.inference.corpus import Record, load_records, packaged_path
from sibylla.schemas.records import Decision, JobEvent
from sibylla.settings import Settings
from sibylla.streams.follow import follow_decisions
from sibylla.streams.launch import WorkerProcess
from sibylla.streams.ship import Shipper
from sibylla.streams.topics import ensure_topics

__all__ = ["pick_demo_jobs", "run_demo"]

DEMO_CORPORA = ("real_public_a.jsonl", "real_public_d.jsonl")
_COLUMNS = ("job", "verdict", "conf", "category", "action", "evidence")


def pick_demo_jobs(records: Sequence[Record], per_category: int, seed: int = 7) -> list[Record]:
    """A few logs of every failure category, in a shuffled order."""
    by_category: dict[str, list[Record]] = {}
    for record in records:
        by_category.setdefault(record.category, []).append(record)
    rng = random.Random(seed)
    picked = [r for cat in sorted(by_category) for r in by_category[cat][:per_category]]
    rng.shuffle(picked)
    return picked


def _row(values: Sequence[str]) -> str:
    widths = (18, 16, 5, 28, 15, 0)
    return "  ".join(v.ljust(w) if w else v for v, w in zip(values, widths, strict=True))


def _print_decision(decision: Decision, truth: Record) -> None:
    evidence = (decision.evidence[0] if decision.evidence else "")[:90]
    print(_row((decision.job_id, decision.verdict, f"{decision.confidence:.2f}",
                decision.category, decision.action, evidence)), flush=True)
    print(_row(("", f"(label: {truth.label[:5]}.)", "", f"(label: {truth.category})", "", "")),
          flush=True)


async def _replay_and_collect(settings: Settings, jobs: Sequence[Record], timeout_s: float
                              ) -> int:
    await ensure_topics(settings)
    truth = {f"demo-{r.id}": r for r in jobs}
    async with Shipper(settings) as shipper:
        for job_id, record in truth.items():
            # A scheduler hook reports the start, the shipper streams the log, the hook
            # reports the failure.
            nodes = (f"gpu-node-{len(job_id) % 7:02d}",)
            await shipper.send_event(JobEvent(job_id, 0, "started", nodes=nodes, gpus=8))
            await shipper.send_lines(job_id, record.log.splitlines(), eos=True, batch_lines=50)
            await shipper.send_event(JobEvent(job_id, 0, "finished", "FAILED", 1, None, nodes,
                                              8))
        await shipper.flush()
    print(_row(_COLUMNS), flush=True)
    seen: set[str] = set()
    deadline = time.monotonic() + timeout_s
    async for decision in follow_decisions(settings, from_beginning=True, idle_timeout_s=None):
        if decision.job_id in truth and decision.job_id not in seen:
            seen.add(decision.job_id)
            _print_decision(decision, truth[decision.job_id])
        if seen == set(truth) or time.monotonic() > deadline:
            break
    missing = set(truth) - seen
    if missing:
        print(f"no decision within {timeout_s:.0f}s for: {', '.join(sorted(missing))}",
              file=sys.stderr)
        return 1
    return 0


def run_demo(settings: Settings, per_category: int, timeout_s: float) -> int:
    records = [r for name in DEMO_CORPORA for r in load_records(packaged_path(name))]
    jobs = pick_demo_jobs(records, per_category)
    with ExitStack() as stack:
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="sibylla-demo-")))
        if not settings.bootstrap_servers:
            broker = stack.enter_context(tansu(workdir))
            print(f"started Tansu on {broker.bootstrap_servers}", file=sys.stderr)
            settings = dataclasses.replace(settings, bootstrap_servers=broker.bootstrap_servers)
        settings = dataclasses.replace(settings, web_port=settings.web_port or free_port(),
                                       data_dir=workdir / "worker")
        print(f"starting a worker (log: {workdir / 'worker.log'})", file=sys.stderr)
        worker = stack.enter_context(WorkerProcess(settings, workdir / "worker.log"))
        print(f"worker pid {worker.pid}; metrics on http://{settings.web_host}:"
              f"{settings.web_port}/metrics; replaying {len(jobs)} failed jobs", file=sys.stderr)
        return asyncio.run(_replay_and_collect(settings, jobs, timeout_s))
