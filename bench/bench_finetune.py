"""Production fine-tunes of the shipped model: do they keep its precision on unseen projects?

The drift experiment (``bench_drift.py``) trains a small model of its own on generated logs.
This one starts from the model `sibylla trainer` would serve, with the trainer's default
recipe and gate, and feeds it real labels: the held-out real logs other than the gate's own
(files k, l and m), split by repository into a stream (60 %) and a test set (40 %) that no
label came from. Every stream label carries a retry-outcome vote with the corpus's label (no
label noise). Labels go through the real ``Trainer`` (hold-back, replay, fine-tune, gate), a
fine-tune every ``--every`` new labels (the production 200 would give one step per stream:
the real logs are few). At the end, the first and the serving model decide the test set.

    python bench/bench_finetune.py          # 8 streams, about a minute on 2 cores

prints a table and writes ``bench/results/finetune.json``. A wrong ``do_not_retry`` kills a
job a retry would have saved, so the column that matters is the wrong ones a stream's
fine-tunes add.
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sibylla.inference.api import Classifier
from sibylla.inference.checkpoint import Checkpoint, load_checkpoint
from sibylla.inference.corpus import (
    HELD_OUT_FILE,
    Record,
    load_records,
    packaged_path,
    project_of,
)
from sibylla.inference.engine import ModelClassifier
from sibylla.inference.evaluate import evaluate_classifier
from sibylla.inference.train import Example, examples_from_records, held_out_files
from sibylla.online_learning.service import replay_seed
from sibylla.online_learning.settings import OnlineSettings
from sibylla.online_learning.store import ModelStore
from sibylla.online_learning.trainer import Trainer
from sibylla.online_learning.votes import outcome_vote, tally
from sibylla.schemas.records import Label

RESULTS = Path(__file__).resolve().parent / "results"
STREAM_SHARE = 0.6  # of the repositories; the rest is the test set


def stream_files(base: Checkpoint) -> list[Path]:
    """The real files ``base`` never trained on, bar the gate's own: what a new cluster's
    labels stand for."""
    return [p for p in held_out_files(base.meta) if p.name != HELD_OUT_FILE]


def split(records: Sequence[Record], seed: int) -> tuple[list[Record], list[Record]]:
    """(stream in a seeded order, test): every repository wholly on one side."""
    projects = sorted({project_of(r) for r in records})
    random.Random(seed).shuffle(projects)
    on_stream = set(projects[: int(STREAM_SHARE * len(projects))])
    stream = [r for r in records if project_of(r) in on_stream]
    random.Random(seed).shuffle(stream)
    return stream, [r for r in records if project_of(r) not in on_stream]


def decisions(classifier: Classifier, test: Sequence[Record]) -> dict[str, Any]:
    """What the scheduler would get on ``test``: macro-F1, jobs stopped, how many wrongly."""
    m = evaluate_classifier(classifier, test)
    stopped = sum(row.get("deterministic", 0) for row in m["confusion"].values())
    wrong = m["confusion"].get("nondeterministic", {}).get("deterministic", 0)
    return {"macro_f1": round(m["macro_f1"], 4), "stopped": stopped, "wrong": wrong,
            "abstention_rate": round(m["abstention_rate"], 4)}


def run_stream(seed: int, every: int, records: Sequence[Record], base: Checkpoint,
               gate_logs: Sequence[Example], replayed: Sequence[Example]) -> dict[str, Any]:
    """One stream through the trainer; the first and the serving model on its test set. Each
    label is what the worker's rule makes of the retry's outcome (a transient failure's retry
    completes, a deterministic one fails again the same way)."""
    stream, test = split(records, seed)
    steps = []
    with tempfile.TemporaryDirectory() as tmp:
        settings = OnlineSettings(models_dir=Path(tmp), finetune_every=every)
        rule = settings.vote_rule()
        trainer = Trainer(settings, ModelStore(Path(tmp)), base, gate_logs, replayed,
                          seed=seed)
        for i, r in enumerate(stream):
            vote = outcome_vote("sig", r.label == "nondeterministic", "sig", rule)
            assert vote is not None
            label = tally([vote], rule)
            assert label is not None
            trainer.add_label(Label(f"job-{r.id}", 1, label, [vote], r.log, r.category,
                                    labeled_at=1000.0 + i))
            trigger = trainer.due()
            if trigger:
                report = trainer.step(trigger)
                steps.append({"promoted": report.result.promote,
                              "reasons": report.result.reasons})
        final = trainer.classifier
        return {"seed": seed, "stream": len(stream), "test": len(test),
                "test_projects": len({project_of(r) for r in test}),
                "first": decisions(ModelClassifier(base, device="cpu"), test),
                "serving": decisions(final, test), "serving_threshold": final.threshold,
                "steps": steps}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=8)
    parser.add_argument("--every", type=int, default=100, help="new labels per fine-tune")
    parser.add_argument("--out", type=Path, default=RESULTS / "finetune.json")
    args = parser.parse_args(argv)
    base = load_checkpoint(None)
    files = stream_files(base)
    records = [r for path in files for r in load_records(path)]
    gate_logs = examples_from_records(load_records(packaged_path(HELD_OUT_FILE)))
    replayed = replay_seed()
    t0 = time.monotonic()
    runs = []
    print("| stream | test logs | first: macro-F1, stopped (wrong) | serving: macro-F1, stopped "
          "(wrong) | promoted / rejected |\n|---|---|---|---|---|")
    for seed in range(args.streams):
        run = run_stream(seed, args.every, records, base, gate_logs, replayed)
        runs.append(run)
        first, serving = run["first"], run["serving"]
        promoted = sum(s["promoted"] for s in run["steps"])
        print(f"| {seed} | {run['test']} | {first['macro_f1']:.3f}, {first['stopped']} "
              f"({first['wrong']}) | {serving['macro_f1']:.3f}, {serving['stopped']} "
              f"({serving['wrong']}) | {promoted} / {len(run['steps']) - promoted} |",
              flush=True)
    totals = {}
    for model in ("first", "serving"):
        stopped = sum(r[model]["stopped"] for r in runs)
        wrong = sum(r[model]["wrong"] for r in runs)
        totals[model] = {"stopped": stopped, "wrong": wrong,  # test sets overlap: no interval
                         "mean_macro_f1": round(sum(r[model]["macro_f1"] for r in runs)
                                                / len(runs), 4)}
        print(f"{model}: {wrong} wrong do_not_retry of {stopped} stopped over the streams' "
              f"test sets, mean macro-F1 {totals[model]['mean_macro_f1']:.3f}")
    result = {"files": [path.name for path in files], "gate_file": HELD_OUT_FILE,
              "every": args.every, "streams": runs, "totals": totals,
              "seconds": round(time.monotonic() - t0, 1)}
    args.out.parent.mkdir(exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
