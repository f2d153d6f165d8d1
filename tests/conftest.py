"""Shared fixtures: real brokers for the integration tests, chosen with ``--brokers``."""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from sibylla.brokers.launchers import apache_kafka, tansu
from sibylla.brokers.process import BrokerProcess

BROKERS = ("tansu", "kafka", "testcontainers")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--brokers", default="tansu,kafka",
        help="comma-separated brokers for integration tests: tansu (embedded), kafka "
             "(Apache Kafka KRaft from Maven jars), testcontainers (needs a Docker engine), "
             "or external=HOST:PORT")


def _broker_names(config: pytest.Config) -> list[str]:
    return [b.strip() for b in config.getoption("--brokers").split(",") if b.strip()]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "broker" in metafunc.fixturenames:
        names = _broker_names(metafunc.config)
        only = getattr(metafunc.function, "only_brokers", None)
        if only:
            names = [n for n in names if n in only]
        metafunc.parametrize("broker", names, indirect=True, scope="session")


class ExternalBroker:
    def __init__(self, bootstrap: str) -> None:
        self.bootstrap_servers = bootstrap
        self.name = "external"


class ContainerBroker:
    """testcontainers' Kafka, when a Docker engine answers."""

    def __init__(self) -> None:
        from testcontainers.kafka import KafkaContainer

        self._container = KafkaContainer().with_kraft()
        self._container.start()
        self.bootstrap_servers = self._container.get_bootstrap_server()
        self.name = "testcontainers"

    def stop(self) -> None:
        self._container.stop()


def _docker_available() -> bool:
    try:
        import docker

        docker.from_env().ping()
        return True
    except Exception:  # noqa: BLE001 - any failure means no engine
        return False


@pytest.fixture(scope="session")
def broker(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[object]:
    """A running broker for the whole session (one per ``--brokers`` entry)."""
    name: str = request.param
    if name.startswith("external="):
        yield ExternalBroker(name.split("=", 1)[1])
        return
    if name == "testcontainers":
        if not _docker_available():
            pytest.skip("testcontainers: no Docker engine answers on this machine")
        container = ContainerBroker()
        yield container
        container.stop()
        return
    if name == "kafka" and (shutil.which("java") is None or shutil.which("mvn") is None):
        pytest.skip("Apache Kafka needs java and mvn on PATH")
    workdir = tmp_path_factory.mktemp(f"broker-{name}")
    process: BrokerProcess = tansu(workdir) if name == "tansu" else apache_kafka(workdir)
    with process:
        yield process


@pytest.fixture
def unique_prefix() -> str:
    """A topic prefix and group of their own per test, so tests never see each other's data."""
    return f"t{uuid.uuid4().hex[:10]}."


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    return tmp_path
