"""The work behind ``sibylla simulate`` and ``sibylla reliability`` (see :mod:`cli`)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np

from sibylla.schemas.records import JobEvent
from sibylla.simulator import ettr
from sibylla.simulator.confusion import ASSUMED, CLASSES, ConfusionMatrix
from sibylla.simulator.jobs import FAILING, Job
from sibylla.simulator.metrics import deterministic_shares, format_table, jct_hours, measure
from sibylla.simulator.policies import (
    ConfusionPolicy,
    FixedRetries,
    MemoryPolicy,
    NeverRetry,
    Oracle,
    RetryPolicy,
    VerdictPolicy,
)
from sibylla.simulator.reliability import (
    META_RSC1_RF,
    FailureRateEstimator,
    event_seconds,
    mttf_hours,
    nodes_for,
)
from sibylla.simulator.scheduler import SimResult, attempt_outcome, simulate
from sibylla.simulator.synthetic import generate, servers_for_load

__all__ = ["run_reliability", "run_simulate"]

# Kokolis et al. (HPCA 2025): r_f = 6.5e-3 per node-day, 8 GPUs per node.
PUBLISHED_MTTF_H = {16_384: 1.8, 131_072: 0.23}
# Above this many expected failures per simulated job the Monte Carlo check would take minutes
# (the job barely progresses); the exact formula still answers.
MC_MAX_FAILURES = 5_000
JOB_SIZES = (8, 64, 512, 1_024, 2_048, 4_096, 8_192, 16_384, 32_768, 65_536, 131_072)


def _trace(args: argparse.Namespace) -> tuple[list[Job], str]:
    if args.trace:
        from sibylla.simulator.philly import read_philly

        trace = read_philly(args.trace)
        skipped = ", ".join(f"{n} {why}" for why, n in trace.skipped.most_common())
        return trace.jobs, f"Philly trace {args.trace}" + (
            f" (skipped: {skipped})" if skipped else ""
        )
    return generate(args.jobs, seed=args.seed), f"synthetic Philly-like trace, seed {args.seed}"


def _matrix(args: argparse.Namespace) -> ConfusionMatrix:
    if args.confusion_json:
        return ConfusionMatrix.from_json(args.confusion_json)
    if args.confusion:
        return ConfusionMatrix.from_numbers(args.confusion)
    return ASSUMED


def _model_policy(args: argparse.Namespace, jobs: list[Job]) -> RetryPolicy:
    from sibylla.inference import ModelLoadError, load_classifier
    from sibylla.simulator.model_policy import (
        corpus_logs,
        generated_logs,
        load_corpus,
        model_verdicts,
    )

    try:
        classifier = load_classifier(args.model or None)
    except ModelLoadError as exc:
        raise SystemExit(f"sibylla simulate --model: {exc}") from None
    if args.model_logs:
        logs = corpus_logs(jobs, load_corpus(args.model_logs), args.seed)
    else:
        logs = generated_logs(jobs, args.seed)
    return VerdictPolicy(model_verdicts(classifier, logs), args.max_retries)


def _bad_simulate_args(args: argparse.Namespace) -> str | None:
    """Why the arguments cannot be simulated, or None."""
    if args.jobs < 1 or args.gpus_per_server < 1 or args.max_retries < 0:
        return "--jobs and --gpus-per-server must be >= 1, --max-retries >= 0"
    if not 0 <= args.retry_success <= 1:
        return "--retry-success must be between 0 and 1"
    if args.load <= 0 or (args.servers is not None and args.servers < 1):
        return "--load must be > 0 and --servers >= 1"
    if args.backfill_depth < 1:
        return "--backfill-depth must be >= 1"
    return None


def run_simulate(args: argparse.Namespace) -> int:
    problem = _bad_simulate_args(args)
    if problem:
        print(f"sibylla simulate: {problem}", file=sys.stderr)
        return 2
    jobs, label = _trace(args)
    if not jobs:
        print("sibylla simulate: the trace has no replayable jobs", file=sys.stderr)
        return 1
    servers = args.servers or servers_for_load(jobs, args.gpus_per_server, args.load)
    matrix = _matrix(args)
    k = args.max_retries
    policies: list[RetryPolicy] = [
        FixedRetries(k),
        NeverRetry(),
        Oracle(k),
        ConfusionPolicy(matrix, k, args.seed),
        ConfusionPolicy(matrix, k, args.seed, per_job=True),
        MemoryPolicy(matrix, lambda job, n: attempt_outcome(job, n, args.seed,
                                                             args.retry_success)[0],
                     k, args.seed),
    ]
    if args.model is not None:
        policies.append(_model_policy(args, jobs))
    results: list[SimResult] = []
    seconds: dict[str, float] = {}
    for policy in policies:
        began = time.perf_counter()
        results.append(
            simulate(
                jobs,
                policy,
                servers,
                args.gpus_per_server,
                args.retry_success,
                args.seed,
                args.backfill_depth,
            )
        )
        seconds[policy.name] = time.perf_counter() - began
    rows = [measure(r) for r in results]
    job_share, gpu_share = deterministic_shares(results[0])
    if args.json:
        print(
            json.dumps(
                {
                    "trace": label,
                    "jobs": len(jobs),
                    "servers": servers,
                    "gpus_per_server": args.gpus_per_server,
                    "confusion_source": matrix.source,
                    "deterministic_job_share": job_share,
                    "deterministic_gpu_hour_share": gpu_share,
                    "seconds": seconds,
                    "policies": [dataclasses.asdict(r) for r in rows],
                },
                indent=2,
            )
        )
    else:
        outcomes = Counter(j.outcome for j in jobs)
        print(
            f"trace: {label}: {len(jobs):,} jobs; "
            + ", ".join(f"{o} {n / len(jobs):.1%}" for o, n in outcomes.most_common())
        )
        print(
            f"cluster: {servers} servers x {args.gpus_per_server} GPUs; FIFO + EASY backfill; "
            f"retry cap {k}; retry of a nondeterministic failure succeeds "
            f"{args.retry_success:.0%}"
        )
        print(
            f"deterministic failures under {policies[0].name}: {job_share:.1%} of jobs, "
            f"{gpu_share:.1%} of GPU-hours (published: 5-23% and 12-20%)"
        )
        print(f"confusion matrix: {matrix.source}")
        for c in CLASSES:
            d, n, u = matrix.rates(c)
            print(
                f"  true {c:<17} -> deterministic {d:.3f}  nondeterministic {n:.3f}  "
                f"unknown {u:.3f}"
            )
        print()
        print(format_table(rows, baseline=policies[0].name))
        print()
        print("replay wall time: " + ", ".join(f"{n} {s:.1f} s" for n, s in seconds.items()))
    if not args.no_plots:
        from sibylla.simulator.plots import plot_gpu_hours, plot_jct_cdf

        out = Path(args.out)
        made = [
            plot_gpu_hours(rows, out / "gpu_hours_by_policy.png"),
            plot_jct_cdf(
                {r.policy: jct_hours(r) for r in results},
                np.array([j.outcome in FAILING for j in jobs]),
                out / "jct_cdf.png",
            ),
        ]
        print("plots: " + ", ".join(map(str, made)), file=sys.stderr if args.json else sys.stdout)
    return 0


def _events(args: argparse.Namespace) -> tuple[Iterable[JobEvent], Counter[str]]:
    """Job events from a JSON Lines file or a Philly trace, and what could not be read."""
    bad: Counter[str] = Counter()
    if args.philly:
        from sibylla.simulator.philly import philly_job_events, read_raw

        return philly_job_events(read_raw(args.philly)), bad
    from sibylla.schemas.records import RecordError, parse_job_event

    def parsed() -> Iterator[JobEvent]:
        for line in Path(args.events).read_bytes().splitlines():
            if line.strip():
                try:
                    yield parse_job_event(line)
                except RecordError:
                    bad["bad records"] += 1

    return parsed(), bad


def _estimate(args: argparse.Namespace) -> tuple[float, float | None, float | None, str]:
    if not (args.events or args.philly):
        rate = args.rf if args.rf is not None else META_RSC1_RF
        source = "given" if args.rf is not None else "Kokolis et al. (HPCA 2025), RSC-1"
        return rate, None, None, source
    estimator = FailureRateEstimator(args.gpus_per_node)
    now = 0.0
    events, bad = _events(args)
    for event in events:
        now = max(now, event_seconds(event.ts, now))
        estimator.observe(event, now)
    rate, lo, hi = estimator.rate_per_node_day(now)
    source = (
        f"{args.events or args.philly}: {estimator.failures} infrastructure failures over "
        f"{estimator.node_days(now):,.1f} node-days"
    ) + "".join(f", {n} {why}" for why, n in bad.items())
    if args.philly:
        source += " (Philly: retried-then-passed failures counted, an upper bound)"
    return rate, lo, hi, source


def run_reliability(args: argparse.Namespace) -> int:
    rate, lo, hi, source = _estimate(args)
    if not rate > 0:
        bound = f"; 95% upper bound {hi:.2e} per node-day" if hi is not None else ""
        print(f"sibylla reliability: no failure rate to project ({source}{bound})", file=sys.stderr)
        return 1
    write, restart = args.write_min / 60, args.restart_min / 60
    per_node = args.gpus_per_node
    ci = f" (95% CI {lo:.2e} .. {hi:.2e})" if lo is not None else ""
    print(f"r_f = {rate:.3e} failures per node-day{ci}  [{source}]")
    print(
        f"checkpoint write {args.write_min:g} min, restart overhead {args.restart_min:g} min, "
        f"{per_node} GPUs per node\n"
    )
    print(f"{'GPUs':>8}{'nodes':>7}{'MTTF h':>10}{'best interval min':>19}{'ETTR':>7}")
    mttfs = []
    for gpus in JOB_SIZES:
        mttf = mttf_hours(gpus, rate, per_node)
        mttfs.append(mttf)
        lam = 1 / mttf
        best = ettr.optimal_interval(lam, write, restart)
        value = ettr.exact(ettr.CheckpointModel(lam, best, write, restart))
        print(
            f"{gpus:>8,}{nodes_for(gpus, per_node):>7,}{mttf:>10.2f}{best * 60:>19.1f}{value:>7.3f}"
        )
    lam = 1 / mttf_hours(args.gpus, rate, per_node)
    best = ettr.optimal_interval(lam, write, restart)
    young = ettr.young_interval(lam, write)
    best_value = ettr.exact(ettr.CheckpointModel(lam, best, write, restart))
    print(
        f"\nETTR of a {args.gpus:,}-GPU job (MTTF {1 / lam:.2f} h) by checkpoint interval; "
        f"Monte Carlo: {args.replicas} jobs of 100 intervals each"
    )
    print(
        f"{'interval min':>13}{'approx':>9}{'exact':>9}{'Monte Carlo':>17}{'approx vs MC':>14}"
        f"{'l*(R+a)':>9}"
    )
    mc: list[tuple[float, float, float]] = []  # (interval, ETTR, standard error)
    for x in np.geomspace(best / 8, best * 8, 7):
        m = ettr.CheckpointModel(lam, float(x), write, restart)
        approx, value = ettr.approximate(m), ettr.exact(m)
        row = f"{x * 60:>13.1f}{approx:>9.4f}{value:>9.4f}"
        failures = lam * 100 * float(x) / value if value > 0 else math.inf
        if failures > MC_MAX_FAILURES:
            print(f"{row}   not simulated: ~{failures:.0e} failures per job")
            continue
        got, se = ettr.monte_carlo(m, 100 * float(x), args.replicas, args.seed)
        mc.append((float(x), got, se))
        print(
            f"{row}{got:>11.4f} ±{se:.4f}{approx / got - 1:>+14.2%}"
            f"{lam * (restart + x + write):>9.3f}"
        )
    print(
        f"optimal interval: {best * 60:.1f} min (ETTR {best_value:.4f}); "
        f"Young's sqrt(2 write / lambda): {young * 60:.1f} min "
        f"(ETTR {ettr.exact(ettr.CheckpointModel(lam, young, write, restart)):.4f})"
    )
    if not args.no_plots:
        from sibylla.simulator.plots import plot_ettr, plot_mttf

        out = Path(args.out)
        sweep = np.geomspace(best / 10, best * 10, 80)
        models = [ettr.CheckpointModel(lam, float(x), write, restart) for x in sweep]
        published = PUBLISHED_MTTF_H if math.isclose(rate, META_RSC1_RF) and per_node == 8 else {}
        made = [
            plot_mttf(
                JOB_SIZES, mttfs, published, f"r_f = {rate:.2e}/node-day", out / "mttf_vs_gpus.png"
            ),
            plot_ettr(
                sweep,
                {
                    "first-order approximation": [ettr.approximate(m) for m in models],
                    "exact (renewal)": [ettr.exact(m) for m in models],
                },
                ([x for x, _, _ in mc], [g for _, g, _ in mc], [e for _, _, e in mc]),
                (best, best_value),
                f"{args.gpus:,} GPUs, write {args.write_min:g} min, restart "
                f"{args.restart_min:g} min",
                out / "ettr_vs_interval.png",
            ),
        ]
        print("plots: " + ", ".join(map(str, made)))
    return 0
