"""Inference throughput and latency per CPU core: preprocessing, forward pass, both.

Windows are shaped like the pipeline benchmark's failed jobs (``--shape pipeline``, the
default): 200 lines of a data-parallel training log (``common.TrainingLog``, each job at its
own offset of the pool) and a traceback (``bench_pipeline.failure_tail``), kept by the stream's
own ``TailWindow``; ``--shape corpus`` instead takes eight generated failure logs end to end.
Every window is distinct (no window is timed twice in a row before the pool wraps).

Rows (torch threads: ``--threads``, default 1, i.e. one core):

- ``preprocess``: ``encode_window`` alone (redaction, masking, line selection, token ids),
  the line-template cache warm as in a long-running worker (its size is reported);
- ``forward``: on already encoded windows, as served (``predict_encoded``: length bucketing,
  the forward pass with the classifier's cache of line vectors, the decisions);
- ``forward, uncached``: the forward pass alone recomputing every line's vector (the cache's
  gain, measured in the same run);
- ``end to end``: ``ModelClassifier.predict`` (both, and the decisions);
- ``incremental``: the decision when the lines were fed to an ``IncrementalFeatures`` as they
  arrived (the feeding is not timed): ``encode`` plus ``predict_encoded``;
- ``ingest feed``: that feeding, every line of each window (what building the features at
  ingest would add to the stream's ingest, against what ``preprocess`` costs at termination);
- ``tf-idf``: the TF-IDF baseline's ``predict``.

Each configuration is timed ``--runs`` times for ``--seconds``; the run with the median
windows/s is reported with the p50/p99 latency of one batch, every run's windows/s and the
load average (the machine may be shared). Writes bench/results/inference[-<device>].json.

    python bench/bench_inference.py [--model PATH] [--device cpu|cuda] [--threads N]
                                    [--shape pipeline|corpus] [--batches 1,64] [--runs N]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

__all__ = ["main", "pipeline_logs"]

logger = logging.getLogger(__name__)

RESULTS = Path(__file__).parent / "results"


def _corpus_windows(n: int, max_tokens: int) -> list[Any]:
    """``n`` distinct windows of at least 7/8 of ``max_tokens`` tokens, each eight generated
    failures' logs end to end."""
    from sibylla.inference.features import window_tokens
    from sibylla.inference.preprocess import window_from_text
    from sibylla.inference.synthetic import generate

    out = []
    records = generate(n * 16, seed=99)
    for i in range(0, len(records), 8):
        log = "\n".join(r.log for r in records[i : i + 8])
        window = window_from_text(log, job_id=str(i // 8))
        if 8 * len(window_tokens(window)[0]) >= 7 * max_tokens:
            out.append(window)
        if len(out) == n:
            break
    return out


def pipeline_logs(n: int) -> list[list[str]]:
    """``n`` failed jobs' outputs as the pipeline benchmark sends them."""
    from bench_pipeline import failure_tail
    from common import LinePool

    pool = LinePool()
    return [pool.take(f"fail-{i}", 200) + failure_tail(i) for i in range(n)]


def _window(lines: Sequence[str], job_id: str) -> Any:
    from sibylla.streams.window import DEFAULT_LIMITS, TailWindow

    window = TailWindow(DEFAULT_LIMITS)
    window.extend(lines, 0.0)
    return window.to_log_window(job_id, 0)


def _time(predict: Callable[[Sequence[Any]], Any], windows: Sequence[Any], batch: int,
          seconds: float) -> dict[str, float]:
    predict(windows[:batch])  # warm-up
    latencies = []
    start = time.perf_counter()
    i = 0
    while time.perf_counter() - start < seconds or len(latencies) < 5:
        chunk = [windows[(i + k) % len(windows)] for k in range(batch)]
        t0 = time.perf_counter()
        predict(chunk)
        latencies.append(time.perf_counter() - t0)
        i += batch
    latencies.sort()
    return {
        "batch": batch,
        "windows_per_s": round(batch * len(latencies) / sum(latencies), 1),
        "p50_ms": round(1000 * statistics.median(latencies), 2),
        "p99_ms": round(1000 * latencies[min(len(latencies) - 1,
                                             int(0.99 * len(latencies)))], 2),
        "batches": len(latencies),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="", help="model file (default: the shipped model)")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default: 1)")
    parser.add_argument("--shape", default="pipeline", choices=["pipeline", "corpus"])
    parser.add_argument("--windows", type=int, default=1024, help="distinct windows")
    parser.add_argument("--seconds", type=float, default=3.0, help="timing per configuration")
    parser.add_argument("--batches", default="1,64")
    parser.add_argument("--runs", type=int, default=3,
                        help="timings per configuration; the median windows/s is reported")
    parser.add_argument("--no-tfidf", action="store_true", help="skip the TF-IDF rows")
    parser.add_argument("--out", default="", help="results file")
    args = parser.parse_args(argv)

    import torch

    from sibylla.inference.baselines import TfidfLogReg
    from sibylla.inference.engine import load_classifier, score_encoded
    from sibylla.inference.features import MAX_TOKENS, encode_window
    from sibylla.inference.incremental import IncrementalFeatures
    from sibylla.inference.preprocess import _template, window_from_text
    from sibylla.inference.synthetic import generate

    torch.set_num_threads(args.threads)
    model = load_classifier(args.model or None, device=args.device)
    if args.shape == "pipeline":
        logs = pipeline_logs(args.windows)
        windows = [_window(lines, str(i)) for i, lines in enumerate(logs)]
    else:
        windows = _corpus_windows(min(args.windows, 96), MAX_TOKENS)
        logs = [[*w.tail] for w in windows]  # the corpus windows' tails fit the limits
    encoded = {id(w): encode_window(w, model.vocab) for w in windows}
    lines_read = statistics.mean(len(e.ids) for e in encoded.values())
    features = {}
    for w, lines in zip(windows, logs, strict=True):
        f = IncrementalFeatures()
        f.feed(lines)
        assert f.encode(model.vocab) == encoded[id(w)], "incremental != batch"
        features[id(w)] = f
    batches = [int(b) for b in args.batches.split(",")]

    def preprocess(chunk: Sequence[Any]) -> Any:
        return [encode_window(w, model.vocab) for w in chunk]

    def forward(chunk: Sequence[Any]) -> Any:
        return model.predict_encoded([encoded[id(w)] for w in chunk])

    def forward_uncached(chunk: Sequence[Any]) -> Any:
        return score_encoded(model.model, [encoded[id(w)] for w in chunk], 64, model.device)

    def incremental(chunk: Sequence[Any]) -> Any:
        return model.predict_encoded([features[id(w)].encode(model.vocab) for w in chunk])

    lines_of = {id(w): lines for w, lines in zip(windows, logs, strict=True)}

    def ingest_feed(chunk: Sequence[Any]) -> Any:
        for w in chunk:
            IncrementalFeatures().feed(lines_of[id(w)])

    configs: list[tuple[str, Callable[[Sequence[Any]], Any]]] = [
        ("preprocess", preprocess), ("forward", forward),
        ("forward, uncached", forward_uncached), ("end to end", model.predict),
        ("incremental", incremental), ("ingest feed", ingest_feed)]
    if not args.no_tfidf:
        train = generate(400, seed=1)
        tfidf = TfidfLogReg().fit([window_from_text(r.log) for r in train],
                                  [r.category for r in train])
        configs.append(("tf-idf", tfidf.predict))
    load_before = os.getloadavg()
    rows = []
    for name, predict in configs:
        for batch in batches:
            runs = [_time(predict, windows, batch, args.seconds) for _ in range(args.runs)]
            runs.sort(key=lambda r: r["windows_per_s"])
            row = {"stage": name, **runs[len(runs) // 2],
                   "windows_per_s_runs": [r["windows_per_s"] for r in runs]}
            rows.append(row)
            print(f"{name:18s} batch {batch:4d}: {row['windows_per_s']:9.1f} windows/s  "
                  f"p50 {row['p50_ms']:8.2f} ms  p99 {row['p99_ms']:8.2f} ms", flush=True)
    result = {
        "model_version": model.version,
        "device": args.device + (f" ({torch.cuda.get_device_name()})"
                                 if args.device == "cuda" else ""),
        "torch_threads": torch.get_num_threads(),
        "cpu": platform.processor() or platform.machine(),
        "shape": args.shape,
        "mean_lines_read_per_window": round(lines_read, 1),
        "windows": len(windows),
        "line_templates_cached": _template.cache_info().currsize,
        "runs": args.runs,
        "loadavg_1_5_15_before": [round(x, 2) for x in load_before],
        "loadavg_1_5_15_after": [round(x, 2) for x in os.getloadavg()],
        "rows": rows,
    }
    out = Path(args.out) if args.out else RESULTS / (
        "inference.json" if args.device == "cpu" else f"inference-{args.device}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print("\n| stage | batch | windows/s | p50 ms | p99 ms |\n|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['stage']} | {row['batch']} | {row['windows_per_s']} | "
              f"{row['p50_ms']} | {row['p99_ms']} |")
    print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
