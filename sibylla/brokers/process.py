"""A broker running as a child process: started, waited for, stopped.

Both embedded brokers (Tansu, and Apache Kafka from Maven jars) are plain child processes;
this module owns their life cycle so that the demo, the ``sibylla broker`` command and the test
fixtures start and stop them the same way.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

__all__ = ["BrokerProcess", "BrokerStartError", "die_with_parent", "free_port",
           "stop_process_group", "wait_for_kafka"]

log = logging.getLogger(__name__)


def stop_process_group(proc: subprocess.Popen[bytes], timeout_s: float) -> None:
    """SIGTERM a child's process group, SIGKILL it if it has not ended within ``timeout_s``."""
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def die_with_parent() -> None:
    """``preexec_fn`` for child servers: on Linux the child gets SIGTERM when its parent dies.

    Brokers and workers run in sessions of their own (so a stop reaches their children), which
    also means nothing ends them if the process that started them is killed; without this, a
    test run stopped by a timeout leaves brokers and workers running on the machine.
    """
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass  # not Linux: the caller's stop() is the only cleanup


class BrokerStartError(RuntimeError):
    """The broker did not come up; the message carries the end of its output."""


def free_port() -> int:
    """A loopback TCP port free now, chosen below the kernel's ephemeral range.

    A port the kernel handed out (``bind(0)``) is an ephemeral one; by the time a server binds
    it, an outgoing connection may be using it as its local port (seen in tests: a restarted
    worker could not bind its web port). Ports below the ephemeral range are never handed out
    that way.
    """
    low = _ephemeral_low()
    rng = random.SystemRandom()
    for _ in range(200):
        port = rng.randrange(max(1024, low - 12000), low)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise OSError("no free TCP port below the ephemeral range")


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


async def _metadata_ok(bootstrap: str) -> bool:
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=3000)
    try:
        await admin.start()
        await admin.list_topics()
        return True
    except Exception:  # noqa: BLE001 - any failure means "not ready yet"
        return False
    finally:
        await admin.close()


def wait_for_kafka(bootstrap: str, timeout_s: float, proc: subprocess.Popen[bytes] | None = None
                   ) -> None:
    """Block until ``bootstrap`` answers a metadata request (or raise after ``timeout_s``)."""
    host, _, port = bootstrap.rpartition(":")
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise BrokerStartError(f"broker exited with code {proc.returncode}")
        try:
            with socket.create_connection((host, int(port)), timeout=1):
                pass
        except OSError:
            time.sleep(0.2)
            continue
        if asyncio.run(_metadata_ok(bootstrap)):
            return
        time.sleep(0.3)
    raise BrokerStartError(f"no Kafka metadata from {bootstrap} within {timeout_s:.0f}s")


class BrokerProcess:
    """A broker child process listening on ``127.0.0.1:port``; a context manager."""

    def __init__(self, name: str, argv: Sequence[str], port: int, log_path: Path,
                 env: dict[str, str] | None = None, start_timeout_s: float = 60.0) -> None:
        self.name = name
        self.argv = list(argv)
        self.port = port
        self.log_path = log_path
        self.env = env
        self.start_timeout_s = start_timeout_s
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap_servers(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def start(self) -> BrokerProcess:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        out = open(self.log_path, "ab")  # noqa: SIM115 - the child owns it while it runs
        log.info("starting %s on %s (log: %s)", self.name, self.bootstrap_servers, self.log_path)
        # A process group of its own, so stop() also ends a launcher script's java child.
        self._proc = subprocess.Popen(
            self.argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env={**os.environ, **(self.env or {})}, start_new_session=True,
            preexec_fn=die_with_parent,
        )
        out.close()
        try:
            wait_for_kafka(self.bootstrap_servers, self.start_timeout_s, self._proc)
        except BrokerStartError as exc:
            self.stop()
            tail = self.log_path.read_text(errors="replace")[-2000:]
            raise BrokerStartError(f"{self.name}: {exc}\n--- log tail ---\n{tail}") from None
        return self

    def stop(self, timeout_s: float = 15.0) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            stop_process_group(proc, timeout_s)

    def __enter__(self) -> BrokerProcess:
        if self._proc is None or self._proc.poll() is not None:
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
