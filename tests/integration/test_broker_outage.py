"""A broker that goes away: a worker starting meanwhile waits for it, then serves; a worker
told to stop meanwhile stops."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import threading
import time
from pathlib import Path

import pytest
from aiokafka.admin import AIOKafkaAdminClient

from sibylla.brokers.launchers import apache_kafka, tansu
from sibylla.brokers.process import BrokerProcess
from sibylla.streams.launch import WorkerProcess
from sibylla.streams.ship import Shipper
from sibylla.streams.topics import ensure_topics
from tests.integration.fixtures import (
    DETERMINISTIC_LOG,
    collect_decisions,
    make_settings,
    only_brokers,
    ship_job,
)

pytestmark = pytest.mark.integration

RESTARTING = "starting again"  # in both of the worker's log lines that say so


class BootstrapGate:
    """A TCP relay to the broker's bootstrap address that can be shut: clients bootstrap
    through it (their later connections go to the address the broker advertises), so
    shutting it makes a client's first connection fail as if the broker were gone."""

    def __init__(self, target: str) -> None:
        host, port = target.rsplit(":", 1)
        self.target = (host, int(port))
        self.server = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.server.getsockname()[1]}"
        self.open = threading.Event()
        self.open.set()
        self.connections = 0  # accepted so far; the n-th is numbered n
        self.refused = 0  # of those, closed at once while shut
        self.ended: set[int] = set()  # the numbers of relayed connections the client closed
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            self.connections += 1
            if not self.open.is_set():
                client.close()
                self.refused += 1
                continue
            upstream = socket.create_connection(self.target)
            number = self.connections
            threading.Thread(target=self._pump, args=(client, upstream, number),
                             daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, number: int = 0) -> None:
        """Relay ``src`` to ``dst``; ``number``: the connection's, when ``src`` is its client."""
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                s.close()
            if number:
                self.ended.add(number)

    def close(self) -> None:
        self.server.close()


def _private_broker(session_broker: BrokerProcess, workdir: Path) -> BrokerProcess:
    """A broker of the session broker's kind for one test to stop and start (not started)."""
    return (tansu if session_broker.name == "tansu" else apache_kafka)(workdir)


@pytest.mark.parametrize("outage", ["until noticed", "one refused connection"])
def test_a_worker_whose_broker_goes_away_during_start_up_waits_and_serves(
        broker, unique_prefix: str, tmp_path: Path, outage: str) -> None:
    """faust exits when its first connection fails; the broker can vanish between the
    worker's topic check and that connection (seen in the fault campaign, where the worker
    then stayed down until a supervisor restarted it). Now it starts again by itself: after
    waiting for the broker while it stays away, and at once when it is back before the
    worker looks (a worker exited rc 1 on such a blip)."""
    gate = BootstrapGate(broker.bootstrap_servers)
    settings = make_settings(gate.address, unique_prefix, tmp_path, broker_wait_s=120)
    asyncio.run(ensure_topics(settings))
    worker = WorkerProcess(settings, tmp_path / "worker.log")
    workers_first = gate.connections + 1

    def log_text() -> str:  # the whole log: the line may have left the tail
        return worker.log_path.read_text(errors="replace") if worker.log_path.exists() else ""

    def away() -> None:
        # The worker's topic check bootstraps through the gate and closes that connection
        # once it has the broker's own address (aiokafka does), before faust starts; shut
        # the gate then, so that faust's first connection finds no broker; open it again a
        # while after the worker noticed, or as soon as it refused that connection. (Shutting
        # it a fixed time after the topic check opened its connection raced a worker that
        # was through faust's bootstrap by then.)
        deadline = time.monotonic() + 60
        while workers_first not in gate.ended and time.monotonic() < deadline:
            time.sleep(0.001)
        gate.open.clear()
        deadline = time.monotonic() + 90
        if outage == "one refused connection":
            while not gate.refused and time.monotonic() < deadline:
                time.sleep(0.001)
        else:
            while RESTARTING not in log_text() and time.monotonic() < deadline:
                time.sleep(0.1)
            time.sleep(2.0)
        gate.open.set()

    # (The worker is started from this thread: it is told to die with the thread that
    # started it.)
    broker_away = threading.Thread(target=away)
    broker_away.start()
    try:
        worker.start(ready_timeout_s=180)
        broker_away.join()
        assert RESTARTING in log_text(), worker.tail()

        async def ship() -> list:
            async with Shipper(settings) as shipper:
                await ship_job(shipper, "after-outage", DETERMINISTIC_LOG, "FAILED")
                await shipper.flush()
            return await collect_decisions(settings, {"after-outage"}, timeout_s=90)

        decisions = asyncio.run(ship())
        assert [d.job_id for d in decisions] == ["after-outage"], worker.tail()
    finally:
        gate.open.set()
        broker_away.join()
        worker.stop()
        gate.close()


@only_brokers("tansu", "kafka")
def test_the_topic_check_of_a_starting_worker_rides_out_a_broker_restart(
        broker, unique_prefix: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """In the fault campaign a worker restarted while Kafka restarted: its topic check had
    connected, its next request met a closed connection, and the worker exited (rc 1)
    instead of waiting the ``broker_wait_s`` it is given. The broker here is a private one,
    of the session broker's kind, stopped just as the check asks for the topics and started
    again 2 s later (Tansu comes back empty: the check then creates the topics anew)."""
    private = _private_broker(broker, tmp_path / "broker")
    settings = make_settings(private.bootstrap_servers, unique_prefix, tmp_path,
                             broker_wait_s=120)
    list_topics = AIOKafkaAdminClient.list_topics
    done = threading.Event()

    def start_again() -> None:
        time.sleep(2.0)
        private.start()
        done.wait()  # the broker is told to die with the thread that started it
    restarter = threading.Thread(target=start_again)

    async def broker_restarts_first(self: AIOKafkaAdminClient) -> list[str]:
        if restarter.ident is None:  # the first call only
            private.stop()
            restarter.start()
        return await list_topics(self)

    private.start()
    try:
        with monkeypatch.context() as patch:
            patch.setattr(AIOKafkaAdminClient, "list_topics", broker_restarts_first)
            asyncio.run(ensure_topics(settings, settings.broker_wait_s))
        assert restarter.ident is not None, "the broker was never restarted"

        async def partition_counts() -> dict[str, int]:
            admin = AIOKafkaAdminClient(bootstrap_servers=private.bootstrap_servers)
            await admin.start()
            try:
                names = [settings.topic("logs"), settings.topic("job-events")]
                return {info["topic"]: len(info["partitions"])
                        for info in await admin.describe_topics(names)}
            finally:
                await admin.close()

        assert asyncio.run(partition_counts()) == {
            settings.topic("logs"): settings.partitions,
            settings.topic("job-events"): settings.partitions}
    finally:
        private.stop()
        done.set()
        if restarter.ident is not None:
            restarter.join()


@only_brokers("tansu", "kafka")
def test_a_worker_told_to_stop_while_its_broker_is_gone_exits_at_once(
        broker, unique_prefix: str, tmp_path: Path) -> None:
    """Operators stop workers during broker outages (a node drained, a deploy). Such a
    worker took minutes to exit: its signal, taken while faust stopped after failing to reach
    Tansu, was lost and the worker started again to wait for the broker; with Apache Kafka,
    whose clients keep retrying, faust waited 60 s for a consumer thread that had ended
    without saying so. The broker here is a private one, of the session broker's kind."""
    private = _private_broker(broker, tmp_path / "broker")
    with private:
        settings = make_settings(private.bootstrap_servers, unique_prefix, tmp_path,
                                 broker_wait_s=120)
        asyncio.run(ensure_topics(settings))
        worker = WorkerProcess(settings, tmp_path / "worker.log").start(ready_timeout_s=180)
    try:
        # The signal comes as faust stops after its crash (Tansu's refusals make it crash at
        # once), or a while into Kafka's clients retrying (they do not give up).
        noticed, deadline = None, time.monotonic() + 60
        while time.monotonic() < deadline:
            log = worker.tail(100_000)
            if "Crashed reason=" in log:
                break
            if noticed is None and "Unable connect" in log:
                noticed = time.monotonic()
            if noticed is not None and time.monotonic() - noticed > 3:
                break
            time.sleep(0.02)
        assert worker.proc is not None
        # (A worker may have started again before: a broker just started can refuse faust's
        # first topic creation. Only what follows the signal counts.)
        signalled_at = worker.log_path.stat().st_size
        os.kill(worker.proc.pid, signal.SIGTERM)
        began = time.monotonic()
        worker.proc.wait(timeout=60)
        took = time.monotonic() - began
        with open(worker.log_path, "rb") as log_file:
            log_file.seek(signalled_at)
            after = log_file.read().decode(errors="replace")
        assert RESTARTING not in after, worker.tail()
        assert took < 15, f"the worker took {took:.0f} s to exit:\n{worker.tail()}"
    finally:
        worker.stop()
