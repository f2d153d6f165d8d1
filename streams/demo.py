"""``sibylla demo``: the whole loop on one machine, with nothing installed beforehand.

Starts Tansu (unless bootstrap servers are configured), a worker and a trainer; replays bundled
real failed-job logs the way a shipper and a scheduler hook would and prints each decision;
retries the jobs Sibylla did not stop (a transient failure's retry completes, a deterministic
one fails again) and prints the labels the votes make; waits for the trainer's gated
fine-tune, prints its scores, and shows the next decision stamped with the promoted model.
Exits 0 when all of that happened within the timeout. Pointed at an existing cluster
(``--bootstrap-servers``), it keeps to topics and a consumer group of its own (:func:`isolated`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import random
import re
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Coroutine, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any, TypeVar

from sibylla.brokers.launchers import tansu
from sibylla.brokers.process import free_port
from sibylla.inference.corpus import HELD_OUT_FILE, Record, load_records, packaged_path
from sibylla.inference.preprocess import window_from_text
from sibylla.inference.train import Example, examples_from_records
from sibylla.online_learning.service import run_trainer
from sibylla.online_learning.settings import OnlineSettings
from sibylla.online_learning.signing import generate_key_pair
from sibylla.online_learning.store import ModelEntry, ModelStore
from sibylla.online_learning.votes import error_signature
from sibylla.schemas.records import Decision, JobEvent, Label, ModelAnnouncement
from sibylla.settings import Settings
from sibylla.streams.follow import follow, follow_decisions
from sibylla.streams.launch import WorkerProcess
from sibylla.streams.ship import Shipper
from sibylla.streams.topics import ensure_topics

__all__ = ["isolated", "pick_demo_jobs", "run_demo", "silent_retries"]

# Real failure logs the shipped model never trained on (its held-out set): the demo's
# decisions are what a cluster would get, mistakes included.
DEMO_CORPUS = HELD_OUT_FILE
# The online-learning loop on a demo's scale: one fine-tune on the handful of labels the
# retries make (every 5th is held back for the gate, as in production), gentle enough for a
# handful (2 epochs at 3e-4: a larger step moves logs the handful says nothing about, and one
# near the threshold then falls below it and the gate refuses the candidate;
# docs/online_learning.md), no trainer metrics port (the demo may run beside a real trainer).
DEMO_ONLINE = OnlineSettings(finetune_every=1, finetune_epochs=2, finetune_lr=3e-4,
                             trainer_metrics_port=0)
T = TypeVar("T")
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


async def _ship_attempt(shipper: Shipper, job_id: str, attempt: int, record: Record,
                        completed: bool) -> None:
    """What a scheduler hook and a log shipper publish for one attempt: its start, its log
    (a failed attempt prints the same failure again) and its end."""
    nodes = (f"gpu-node-{(len(job_id) + attempt) % 7:02d}",)
    await shipper.send_event(JobEvent(job_id, attempt, "started", nodes=nodes, gpus=8))
    if completed:
        await shipper.send_lines(job_id, ["resumed from the last checkpoint",
                                          "training finished"], attempt, eos=True)
        await shipper.send_event(JobEvent(job_id, attempt, "finished", "COMPLETED", 0, None,
                                          nodes, 8))
    else:
        await shipper.send_lines(job_id, record.log.splitlines(), attempt, eos=True,
                                 batch_lines=50)
        await shipper.send_event(JobEvent(job_id, attempt, "finished", "FAILED", 1, None, nodes,
                                          8))


async def _decide_all(settings: Settings, jobs: dict[str, Record], timeout_s: float
                      ) -> dict[str, Decision]:
    """Ship attempt 0 of every job; print each decision as it comes."""
    async with Shipper(settings) as shipper:
        for job_id, record in jobs.items():
            await _ship_attempt(shipper, job_id, 0, record, completed=False)
        await shipper.flush()
    print(_row(_COLUMNS), flush=True)
    decided: dict[str, Decision] = {}

    async def collect() -> None:
        async with contextlib.aclosing(follow_decisions(settings)) as decisions:
            async for decision in decisions:
                if (decision.job_id in jobs and decision.attempt == 0
                        and decision.job_id not in decided):
                    decided[decision.job_id] = decision
                    _print_decision(decision, jobs[decision.job_id])
                if len(decided) == len(jobs):
                    return

    await _within(collect(), timeout_s)
    return decided


def silent_retries(retried: dict[str, Record]) -> list[str]:
    """The retried jobs whose outcome casts no vote, so that no label comes for them: a retry
    that fails again votes only when the two attempts' error lines can be compared
    (:func:`~sibylla.online_learning.votes.outcome_vote`), and a log with no line that opens
    an error (a CLI's ``Usage: ...`` / ``Error: No such command``) has none."""
    return sorted(job_id for job_id, record in retried.items()
                  if record.label == "deterministic"
                  and not error_signature(window_from_text(record.log)))


async def _retry_and_label(settings: Settings, jobs: dict[str, Record],
                           decided: dict[str, Decision], timeout_s: float) -> int:
    """The scheduler retries what Sibylla did not stop; a transient failure's retry completes,
    a deterministic one fails the same way. The workers turn each outcome into a vote and a
    majority into a Label, printed as it comes. Returns how many labels came."""
    retried = {job_id: jobs[job_id] for job_id, d in decided.items()
               if d.action != "do_not_retry"}
    print(f"\n== the scheduler retries the {len(retried)} jobs not stopped; each outcome votes "
          "on the first attempt's true class ==", flush=True)
    async with Shipper(settings) as shipper:
        for job_id, record in retried.items():
            await _ship_attempt(shipper, job_id, 1, record,
                                completed=record.label == "nondeterministic")
        await shipper.flush()
    silent = silent_retries(retried)
    for job_id in silent:
        print(f"no vote  {job_id:<16} its retry failed again, but no line of its log opens an "
              "error to compare", flush=True)
    expected = set(retried) - set(silent)
    labeled: set[str] = set()

    async def collect() -> None:
        async with contextlib.aclosing(follow(settings, "labels", Label.from_json)) as labels:
            async for label in labels:
                if label.job_id in retried and label.job_id not in labeled:
                    labeled.add(label.job_id)
                    votes = ", ".join(f"{v.source}={v.label[:5]}. ({v.weight:g})"
                                      for v in label.votes)
                    print(f"label  {label.job_id:<18} {label.label:<16} votes: {votes}",
                          flush=True)
                if labeled == expected:
                    return

    await _within(collect(), timeout_s)
    return len(labeled)


async def _first_candidate(online: OnlineSettings, timeout_s: float) -> ModelEntry | None:
    """The trainer's first candidate, promoted or refused (the demo's labels make one)."""
    async def poll() -> ModelEntry:
        store = ModelStore(online.models_dir)
        while not (made := [e for e in store.entries() if e.status != "base"]):
            await asyncio.sleep(0.5)
        return made[0]

    return await _within(poll(), timeout_s)


async def _announcement(settings: Settings, version: str, timeout_s: float
                        ) -> ModelAnnouncement | None:
    """The announcement of ``version`` on sibylla.models (what the workers act on)."""
    async def first() -> ModelAnnouncement | None:
        announced = follow(settings, "models", ModelAnnouncement.from_json)
        async with contextlib.aclosing(announced) as announcements:
            async for ann in announcements:
                if ann.version == version:
                    return ann
        return None

    return await _within(first(), timeout_s)


def _print_models(online: OnlineSettings) -> None:
    """Every candidate the trainer made, with both models' scores and the gate's result."""
    store = ModelStore(online.models_dir)
    for entry in store.entries():
        if entry.status == "base":
            continue
        print(f"candidate {entry.version} (from {entry.parent}, {entry.scores.get('n_new')} "
              f"new labels + {entry.scores.get('n_replay')} replayed): {entry.status.upper()}",
              flush=True)
        for model in ("current", "candidate"):
            parts = entry.scores.get(model, {})
            scores = "; ".join(f"{part}: accuracy {s['accuracy']:.3f}, deterministic precision "
                               + (f"{s['det_precision']:.3f}" if s["det_decided"] else "-")
                               + f" (n={s['n']})" for part, s in parts.items() if s.get("n"))
            print(f"  {model:<9} {scores}", flush=True)
        for reason in entry.reasons:
            print(f"  refused: {reason}", flush=True)


async def _serve_with_new_model(settings: Settings, metrics_text: Callable[[], str],
                                jobs: dict[str, Record], version: str, timeout_s: float
                                ) -> bool:
    """Wait until the worker has swapped the model in, then show a new failure decided by it."""
    deadline = time.monotonic() + timeout_s
    while await _worker_model(metrics_text) != version:
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.5)
    job_id, record = next(iter(jobs.items()))
    new_id = f"{job_id}-rerun"
    async with Shipper(settings) as shipper:
        await _ship_attempt(shipper, new_id, 0, record, completed=False)
        await shipper.flush()

    async def decided() -> Decision | None:
        async with contextlib.aclosing(follow_decisions(settings)) as decisions:
            async for decision in decisions:
                if decision.job_id == new_id:
                    return decision
        return None

    decision = await _within(decided(), deadline - time.monotonic())
    if decision is None:
        return False
    print(f"\n== a new failure, decided by the promoted model ==\n{decision.job_id}: "
          f"{decision.verdict} ({decision.confidence:.2f}), {decision.action}, "
          f"model_version={decision.model_version}", flush=True)
    return decision.model_version == version


async def _within(step: Coroutine[Any, Any, T], timeout_s: float) -> T | None:
    """``step``'s result, or None when it has not finished within ``timeout_s``."""
    try:
        return await asyncio.wait_for(step, max(0.0, timeout_s))
    except TimeoutError:
        return None


async def _worker_model(metrics_text: Callable[[], str]) -> str | None:
    """The version on the worker's ``sibylla_model_info`` gauge (None while unreachable)."""
    try:
        text = await asyncio.to_thread(metrics_text)
    except OSError:
        return None
    # Labels in any order: version and device (where the model runs).
    found = re.search(r'^sibylla_model_info\{(?:[^}]*,)?version="([^"]+)"[^}]*\} 1\.0$', text,
                      re.M)
    return found.group(1) if found else None


async def _demo(settings: Settings, metrics_text: Callable[[], str], online: OnlineSettings,
                jobs: Sequence[Record], validation: Sequence[Example], timeout_s: float) -> int:
    await ensure_topics(settings)
    truth = {f"demo-{r.id}": r for r in jobs}
    deadline = time.monotonic() + timeout_s
    decided = await _decide_all(settings, truth, timeout_s)
    missing = set(truth) - set(decided)
    if missing:
        print(f"no decision within {timeout_s:.0f}s for: {', '.join(sorted(missing))}",
              file=sys.stderr)
        return 1
    labels = await _retry_and_label(settings, truth, decided, deadline - time.monotonic())
    # Started once the labels are out, so that it reads them all at once from the topic's start
    # and the demo's one fine-tune trains on the same examples every time.
    trainer = asyncio.create_task(run_trainer(settings, online, validation))
    try:
        print("\n== the trainer reads the labels, fine-tunes on them, gates the candidate on "
              "logs it never trained on, announces it ==", flush=True)
        candidate = await _first_candidate(online, deadline - time.monotonic())
        _print_models(online)
        if candidate is None or candidate.status != "promoted":
            print(f"no model promoted ({labels} labels; "
                  f"{'the gate refused the candidate' if candidate else 'no candidate'})",
                  file=sys.stderr)
            return 1
        ann = await _announcement(settings, candidate.version, deadline - time.monotonic())
        if ann is None:
            print(f"{candidate.version} was not announced within {timeout_s:.0f}s",
                  file=sys.stderr)
            return 1
        print(f"promoted and announced on {settings.topic('models')}: {ann.version} "
              f"(sha256 {ann.sha256[:12]}…, {ann.uri}, sequence {ann.sequence}, "
              f"{'signed' if ann.signature else 'unsigned'})", flush=True)
        if not await _serve_with_new_model(settings, metrics_text, truth, ann.version,
                                           deadline - time.monotonic()):
            print(f"the worker did not swap in {ann.version} within {timeout_s:.0f}s",
                  file=sys.stderr)
            return 1
        return 0
    finally:
        trainer.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await trainer


def isolated(settings: Settings) -> Settings:
    """``settings`` with topics and a consumer group no one else uses.

    On a real cluster the demo must not reach the cluster's own users: its decisions would go
    to the schedulers, its worker would join the workers' consumer group (a rebalance for
    every real worker), and its trainer would announce a model, from a file only this machine
    has, on the compacted models topic every worker follows.
    """
    token = uuid.uuid4().hex[:8]
    return dataclasses.replace(
        settings, topic_prefix=f"{settings.topic_prefix.rstrip('.')}-demo-{token}.",
        group_id=f"{settings.group_id}-demo-{token}")


def run_demo(settings: Settings, per_category: int, timeout_s: float) -> int:
    # The demo's own consumers (decisions, labels, models) would log every subscription.
    logging.getLogger("aiokafka").setLevel(logging.WARNING)
    records = load_records(packaged_path(DEMO_CORPUS))
    jobs = pick_demo_jobs(records, per_category)
    # The gate judges on the held-out logs the demo does not replay: none of its labels.
    replayed = {r.id for r in jobs}
    validation = examples_from_records([r for r in records if r.id not in replayed])
    with ExitStack() as stack:
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="sibylla-demo-")))
        if not settings.bootstrap_servers:
            broker = stack.enter_context(tansu(workdir))
            print(f"started Tansu on {broker.bootstrap_servers}", file=sys.stderr)
            # Tansu 0.6.0 under-reports a partition's end offset (docs/brokers.md): a RocksDB
            # store's saved changelog offsets then look ahead of the broker and faust refuses
            # to start. The demo's worker keeps its tables in memory and rebuilds them from
            # the changelog; it never restarts anyway.
            settings = dataclasses.replace(settings, bootstrap_servers=broker.bootstrap_servers,
                                           store="memory")
        else:
            settings = isolated(settings)
            print(f"on {settings.bootstrap_servers}: topics {settings.topic_prefix}* and "
                  f"consumer group {settings.group_id} of the demo's own (delete them after)",
                  file=sys.stderr)
        settings = dataclasses.replace(settings, web_port=settings.web_port or free_port(),
                                       data_dir=workdir / "worker")
        # The trainer signs its announcements with a key pair of the demo's own; the worker
        # loads only what that key signed, from the demo's models directory.
        key_path = workdir / "signing.key"
        _, public_key = generate_key_pair(key_path)
        online = dataclasses.replace(DEMO_ONLINE, models_dir=workdir / "models",
                                     model_signing_key=str(key_path),
                                     model_public_key=public_key)
        print(f"starting a worker (log: {workdir / 'worker.log'}); model announcements signed "
              f"by {key_path}", file=sys.stderr)
        worker = stack.enter_context(WorkerProcess(settings, workdir / "worker.log",
                                                   online.to_env()))
        print(f"worker pid {worker.pid}; metrics on http://{settings.web_host}:"
              f"{settings.web_port}/metrics; replaying {len(jobs)} failed jobs", file=sys.stderr)
        return asyncio.run(_demo(settings, worker.metrics_text, online, jobs, validation,
                                 timeout_s))
