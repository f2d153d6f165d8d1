"""Run a reproduction's probe against the broker named on the command line (``tansu``, or
Apache Kafka from deploy/kafka otherwise), started in a scratch directory and stopped after."""

import asyncio
import sys
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path

from sibylla.brokers.launchers import apache_kafka, tansu


def run_against_named_broker(probe: Callable[[str], Awaitable[None]]) -> None:
    """``probe(bootstrap_servers)`` against the broker ``sys.argv`` names."""
    launch = tansu if sys.argv[1:] == ["tansu"] else apache_kafka
    with tempfile.TemporaryDirectory() as workdir, launch(Path(workdir)) as broker:
        asyncio.run(probe(broker.bootstrap_servers))
