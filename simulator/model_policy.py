"""Sibylla driven by the shipped model: classify a generated log for every failing job.

For each job that fails in the trace, a log of its true class (and category, when the corpus has
one) is drawn from a labelled corpus in the CONVENTIONS.md format (JSON Lines with ``label``,
``category`` and ``log``), cut into the :class:`LogWindow` the stream would have kept, and
classified in batches. The verdict is reused for the job's later failures: a retry of the same
job prints the same kind of log. The classifier arrives through ``sibylla.inference``, which is
imported only here, so the simulator works without it.
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Iterable, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import orjson
from sibylla.simulator.jobs import FAILING, Job

__all__ = ["load_corpus", "model_verdicts", "packaged_corpus"]

TAIL_LINES = 50
FIRST_ERROR_LINES = 20


def load_corpus(paths: Iterable[str | Path]) -> list[dict[str, Any]]:
    """Labelled logs from JSON Lines files; entries without a label or a log are skipped."""
    entries = []
    for path in paths:
        for line in Path(path).read_bytes().splitlines():
            if not line.strip():
                continue
            entry = orjson.loads(line)
            if entry.get("label") in ("deterministic", "nondeterministic") and entry.get("log"):
                entries.append(entry)
    return entries


def packaged_corpus() -> list[Path]:
    """The JSON Lines files the classifier package ships, if it is installed with data."""
    try:
        root = resources.files("sibylla.inference") / "data"
    except ModuleNotFoundError:
        return []
    if not root.is_dir():
        return []
    return sorted(Path(str(p)) for p in root.iterdir() if p.name.endswith(".jsonl"))


def _window(job: Job, log: str):  # type: ignore[no-untyped-def]
    from sibylla.inference.api import LogWindow, is_error_start

    lines = log.split("\n")
    first = next((i for i, line in enumerate(lines) if is_error_start(line)), None)
    first_error = [] if first is None else lines[first : first + FIRST_ERROR_LINES]
    return LogWindow(job.job_id, 0, lines[-TAIL_LINES:], first_error, len(lines))


def model_verdicts(
    jobs: Sequence[Job],
    classifier: Any,
    corpus: Sequence[dict[str, Any]],
    seed: int = 0,
    batch: int = 256,
) -> dict[str, str]:
    """Verdict of ``classifier`` (anything with ``predict(windows)``) per failing job id."""
    by_label: dict[str, list[str]] = defaultdict(list)
    by_category: dict[tuple[str, str], list[str]] = defaultdict(list)
    for entry in corpus:
        by_label[entry["label"]].append(entry["log"])
        by_category[(entry["label"], entry.get("category", ""))].append(entry["log"])
    failing = [j for j in jobs if j.outcome in FAILING]
    missing = {j.outcome for j in failing} - set(by_label)
    if missing:
        raise ValueError(f"the log corpus has no {', '.join(sorted(missing))} logs")
    rng = random.Random(seed)
    verdicts: dict[str, str] = {}
    for lo in range(0, len(failing), batch):
        chunk = failing[lo : lo + batch]
        windows = []
        for job in chunk:
            pool = by_category.get((job.outcome, job.category)) or by_label[job.outcome]
            windows.append(_window(job, rng.choice(pool)))
        for job, prediction in zip(chunk, classifier.predict(windows), strict=True):
            verdicts[job.job_id] = prediction.verdict
    return verdicts
