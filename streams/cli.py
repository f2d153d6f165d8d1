"""Subcommands of the streaming stage: worker, demo, decisions, nodes, ship."""

from __future__ import annotations

import argparse
from typing import Any

from sibylla.settings import CONNECTION, add_settings_arguments, settings_from_args

__all__ = ["register"]


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("worker", help="run a stream worker (ingest, decide, serve HTTP)")
    add_settings_arguments(p)
    p.set_defaults(func=_worker)

    p = subparsers.add_parser(
        "demo", help="start Tansu, a worker and the trainer; replay bundled failed jobs, print "
        "decisions, retry the ones not stopped, print labels, the gated candidate and a "
        "decision by the promoted model")
    p.add_argument("--jobs-per-class", type=int, default=1,
                   help="bundled logs replayed per failure category")
    p.add_argument("--timeout", type=float, default=120.0, help="give up after this many s")
    add_settings_arguments(p)
    p.set_defaults(func=_demo)

    p = subparsers.add_parser("decisions", help="print decisions as JSON lines")
    p.add_argument("--follow", action="store_true", help="keep waiting for new decisions")
    p.add_argument("--from-beginning", action="store_true",
                   help="start at the oldest decision kept (default: with --follow, new ones)")
    add_settings_arguments(p, only=CONNECTION)
    p.set_defaults(func=_decisions)

    p = subparsers.add_parser(
        "nodes", help="nodes blamed by failures of many jobs (suspect lemon nodes)",
        description="Reads every decision kept on the topic; a node blamed (GPU fault lines, "
        "node failures) by at least nodes_suspect_jobs distinct jobs is a suspect.")
    p.add_argument("--all", action="store_true", help="every blamed node, not just suspects")
    p.add_argument("--json", action="store_true", help="JSON lines")
    add_settings_arguments(p, only=CONNECTION | {"nodes_suspect_jobs"})
    p.set_defaults(func=_nodes)

    p = subparsers.add_parser("ship", help="publish a job's log file to Kafka as LogBatch "
                              "records (and optionally its termination event)")
    p.add_argument("job_id")
    p.add_argument("file", help="log file, or - for standard input")
    p.add_argument("--attempt", type=int, default=0)
    p.add_argument("--batch-lines", type=int, default=500, help="lines per LogBatch record")
    p.add_argument("--state", help="also publish a finished JobEvent with this state "
                   "(e.g. FAILED)")
    p.add_argument("--exit-code", type=int)
    p.add_argument("--nodes", default="", help="comma-separated host names of the attempt")
    add_settings_arguments(p)
    p.set_defaults(func=_ship)


def _worker(args: argparse.Namespace) -> int:
    from sibylla.settings import SettingsError
    from sibylla.streams.worker import run_worker

    settings = settings_from_args(args)
    if not settings.bootstrap_servers:
        raise SettingsError("bootstrap_servers: required for a worker "
                            "(SIBYLLA_BOOTSTRAP_SERVERS or --bootstrap-servers)")
    return run_worker(settings)


def _demo(args: argparse.Namespace) -> int:
    from sibylla.streams.demo import run_demo

    settings = settings_from_args(args, store="memory", grace_period_s=0.5, web_port=0)
    return run_demo(settings, args.jobs_per_class, args.timeout)


def _decisions(args: argparse.Namespace) -> int:
    import asyncio

    from sibylla.streams.follow import print_decisions

    settings = settings_from_args(args)
    return asyncio.run(print_decisions(settings, args.follow, args.from_beginning))


def _nodes(args: argparse.Namespace) -> int:
    import asyncio

    from sibylla.streams.nodes import print_nodes

    settings = settings_from_args(args)
    return asyncio.run(print_nodes(settings, args.json, args.all))


def _ship(args: argparse.Namespace) -> int:
    import asyncio

    from sibylla.streams.ship import ship_file

    settings = settings_from_args(args)
    return asyncio.run(ship_file(settings, args))
