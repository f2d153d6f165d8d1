"""Subcommands of the scheduler stage: ``sibylla slurm epilog|drain-spool|actuator``."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from sibylla.settings import Settings, SettingsError, add_settings_arguments, settings_from_args

__all__ = ["register"]


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("slurm", help="Slurm integration: the epilog hook that publishes "
                              "job attempts, the actuator that applies decisions")
    slurm = p.add_subparsers(dest="slurm_command", required=True, metavar="SLURM_COMMAND")

    e = slurm.add_parser(
        "epilog", help="EpilogSlurmctld hook: publish the finished attempt's output and event",
        description="Run by slurmctld as EpilogSlurmctld (reads SLURM_JOB_* variables). "
        "Submit jobs with --open-mode=append (or per-attempt output names): Slurm truncates "
        "the output file when a job is requeued.")
    add_settings_arguments(e)
    e.set_defaults(func=_epilog)

    d = slurm.add_parser(
        "drain-spool", help="publish the attempts the epilog spooled while the broker was away",
        description="The epilog keeps an attempt the broker did not take in a spool under "
        "slurm_epilog_state_dir, and every later epilog run publishes it; this publishes it "
        "now (cron it on the controller, or run it after a broker outage). Exits 1 while "
        "attempts are left.")
    add_settings_arguments(d)
    d.set_defaults(func=_drain_spool)

    a = slurm.add_parser(
        "actuator", help="follow sibylla.decisions and requeue, exclude nodes or hold jobs",
        description="Applies each decision with scontrol; one JSON audit line per decision "
        "(slurm_audit_file, or stdout). Safe to restart: replayed decisions do nothing twice.")
    add_settings_arguments(a)
    a.set_defaults(func=_actuator)


def _with_brokers(args: argparse.Namespace, command: str) -> Settings:
    """The settings, which must name the brokers: an epilog without them would keep every
    attempt in its spool as if the broker were away, and an actuator would follow nothing."""
    settings = settings_from_args(args)
    if not settings.bootstrap_servers:
        raise SettingsError(f"bootstrap_servers: required for {command} "
                            "(SIBYLLA_BOOTSTRAP_SERVERS or --bootstrap-servers)")
    return settings


def _epilog(args: argparse.Namespace) -> int:
    import os

    from sibylla.scheduler.epilog import run_epilog

    try:
        settings = _with_brokers(args, "the epilog")
        print(run_epilog(settings, os.environ), file=sys.stderr)
    except Exception as exc:  # noqa: BLE001 - slurmctld logs one line; the job is untouched
        print(f"sibylla epilog: job {os.environ.get('SLURM_JOB_ID', '?')}: not published: "
              f"{type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    return 0


def _drain_spool(args: argparse.Namespace) -> int:
    from sibylla.scheduler.epilog import drain_spool

    published, left = drain_spool(_with_brokers(args, "drain-spool"))
    print(f"sibylla slurm drain-spool: {published} spooled attempt(s) published, {left} left",
          file=sys.stderr)
    return 1 if left else 0


def _actuator(args: argparse.Namespace) -> int:
    import asyncio

    from sibylla.scheduler.actuator import run_actuator

    return asyncio.run(run_actuator(_with_brokers(args, "the actuator")))
