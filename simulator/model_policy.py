"""Sibylla driven by the shipped model: classify a generated log for every failing job.

Each failing job gets a log of its category (Philly jobs, which have none, get a category of
their class drawn at random): by default rendered by the classifier package's synthetic log
generator, or drawn from a labelled corpus in the CONVENTIONS.md format (JSON Lines with
``label``, ``category`` and ``log``). The log is cut into the :class:`LogWindow` the stream
would have kept and classified in batches. The verdict is reused for the job's later failures:
a retry of the same job prints the same kind of log. ``sibylla.inference`` is imported only
here, so the rest of the simulator works without it.
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson

from sibylla.inference.taxonomy import DETERMINISTIC, NONDETERMINISTIC
from sibylla.simulator.jobs import FAILING, Job

__all__ = ["corpus_logs", "generated_logs", "load_corpus", "model_verdicts"]

_CATEGORIES = {
    "deterministic": DETERMINISTIC,
    "nondeterministic": NONDETERMINISTIC,
}


def _categorised(jobs: Sequence[Job], seed: int) -> list[tuple[Job, str]]:
    rng = random.Random(seed)
    return [
        (j, j.category or rng.choice(_CATEGORIES[j.outcome])) for j in jobs if j.outcome in FAILING
    ]


def generated_logs(jobs: Sequence[Job], seed: int = 0) -> dict[str, str]:
    """A log per failing job from ``sibylla.inference.synthetic``, one batch per category."""
    from sibylla.inference.synthetic import generate

    by_category: dict[str, list[Job]] = defaultdict(list)
    for job, category in _categorised(jobs, seed):
        by_category[category].append(job)
    logs: dict[str, str] = {}
    for k, (category, group) in enumerate(sorted(by_category.items())):
        records = generate(len(group), seed * 1000 + k, categories=[category])
        logs.update((job.job_id, record.log) for job, record in zip(group, records, strict=True))
    return logs


def load_corpus(paths: Iterable[str | Path]) -> list[dict[str, Any]]:
    """Labelled logs from JSON Lines files; entries without a label or a log are skipped."""
    entries = []
    for path in paths:
        for line in Path(path).read_bytes().splitlines():
            if line.strip():
                entry = orjson.loads(line)
                if entry.get("label") in _CATEGORIES and entry.get("log"):
                    entries.append(entry)
    return entries


def corpus_logs(
    jobs: Sequence[Job], corpus: Sequence[Mapping[str, Any]], seed: int = 0
) -> dict[str, str]:
    """A log per failing job drawn from ``corpus``: same category when it has one, else class."""
    by_label: dict[str, list[str]] = defaultdict(list)
    by_category: dict[str, list[str]] = defaultdict(list)
    for entry in corpus:
        by_label[entry["label"]].append(entry["log"])
        by_category[entry.get("category", "")].append(entry["log"])
    rng = random.Random(seed)
    logs = {}
    for job, category in _categorised(jobs, seed):
        pool = by_category.get(category) or by_label.get(job.outcome)
        if not pool:
            raise ValueError(f"the log corpus has no {job.outcome} logs")
        logs[job.job_id] = rng.choice(pool)
    return logs


def model_verdicts(classifier: Any, logs: Mapping[str, str], batch: int = 256) -> dict[str, str]:
    """Verdict of ``classifier`` (anything with ``predict(windows)``) for each job's log."""
    from sibylla.inference.preprocess import window_from_text  # the stream's own window

    items = sorted(logs.items())
    verdicts: dict[str, str] = {}
    for lo in range(0, len(items), batch):
        chunk = items[lo : lo + batch]
        predictions = classifier.predict([window_from_text(log, job_id) for job_id, log in chunk])
        for (job_id, _), prediction in zip(chunk, predictions, strict=True):
            verdicts[job_id] = prediction.verdict
    return verdicts
