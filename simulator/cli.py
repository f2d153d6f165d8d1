"""``sibylla simulate`` and ``sibylla reliability``: registered cheaply, run from :mod:`commands`.

Registering only builds argument parsers; numpy, matplotlib and the classifier are imported when
a command runs, so ``sibylla --help`` and the streaming commands start instantly.
"""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["register"]


def _simulate(args: argparse.Namespace) -> int:
    from sibylla.simulator.commands import run_simulate

    return run_simulate(args)


def _reliability(args: argparse.Namespace) -> int:
    from sibylla.simulator.commands import run_reliability

    return run_reliability(args)


def register(subparsers: Any) -> None:
    sim = subparsers.add_parser(
        "simulate",
        help="replay a cluster trace under retry policies and compare what each costs",
        description="Replay a Philly trace (or a Philly-like synthetic one) on a GPU cluster "
        "with FIFO + EASY backfill under several retry policies; print a table, write plots.",
    )
    sim.add_argument("--trace", help="Philly cluster_job_log file (default: synthetic trace)")
    sim.add_argument("--jobs", type=int, default=100_000, help="synthetic jobs (default 100000)")
    sim.add_argument("--seed", type=int, default=0)
    sim.add_argument("--servers", type=int, help="servers in the cluster (default: from --load)")
    sim.add_argument(
        "--load",
        type=float,
        default=0.7,
        help="size the cluster so first attempts use this share of it (default 0.7)",
    )
    sim.add_argument("--gpus-per-server", type=int, default=8)
    sim.add_argument(
        "--max-retries",
        type=int,
        default=3,
        help="retry cap of the fixed policy, also applied to the others (default 3)",
    )
    sim.add_argument(
        "--retry-success",
        type=float,
        default=0.8,
        help="chance that a retry of a nondeterministic failure succeeds (0.8)",
    )
    sim.add_argument("--backfill-depth", type=int, default=64)
    cm = sim.add_mutually_exclusive_group()
    cm.add_argument("--confusion-json", help="output of `sibylla evaluate --json`")
    cm.add_argument(
        "--confusion",
        metavar="DD,DN,ND,NN",
        help="confusion counts, true class first (6 numbers add unknowns)",
    )
    sim.add_argument(
        "--model",
        nargs="?",
        const="",
        default=None,
        metavar="PATH",
        help="also run Sibylla with the shipped model on generated logs",
    )
    sim.add_argument(
        "--model-logs",
        nargs="+",
        metavar="JSONL",
        help="labelled logs for --model (default: the classifier's log generator)",
    )
    sim.add_argument("--out", default="simulation", help="folder for the plots")
    sim.add_argument("--no-plots", action="store_true")
    sim.add_argument("--json", action="store_true", help="print the metrics as JSON")
    sim.set_defaults(func=_simulate)

    rel = subparsers.add_parser(
        "reliability",
        help="failure rate, MTTF by job size, ETTR and the optimal checkpoint interval",
        description="Estimate r_f (from job events, or given), project MTTF = 1/(N_nodes r_f) "
        "by job size and ETTR against checkpoint interval, checked by Monte Carlo.",
    )
    src = rel.add_mutually_exclusive_group()
    src.add_argument("--rf", type=float, help="failures per node-day (default 6.5e-3, Meta RSC-1)")
    src.add_argument("--events", help="JSON Lines of JobEvent records to estimate r_f from")
    src.add_argument(
        "--philly",
        metavar="TRACE",
        help="estimate r_f from a Philly cluster_job_log (an upper bound)",
    )
    rel.add_argument("--gpus-per-node", type=int, default=8)
    rel.add_argument("--gpus", type=int, default=16_384, help="job size for the ETTR sweep")
    rel.add_argument("--write-min", type=float, default=2.0, help="checkpoint write, minutes")
    rel.add_argument("--restart-min", type=float, default=10.0, help="restart overhead, minutes")
    rel.add_argument("--replicas", type=int, default=2000, help="Monte Carlo jobs per point")
    rel.add_argument("--seed", type=int, default=0)
    rel.add_argument("--out", default="reliability", help="folder for the plots")
    rel.add_argument("--no-plots", action="store_true")
    rel.set_defaults(func=_reliability)
