"""Starting a worker as a child process (the demo and the tests do; the benchmark's
``bench/common.Worker`` starts one the same way and adds CPU and memory probes).

A faust worker owns its process (event loop, signal handlers), so tools that need one beside
them run ``python -m sibylla worker`` with the settings passed as ``SIBYLLA_*`` variables.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Mapping
from pathlib import Path

from sibylla.brokers.process import die_with_parent, free_port, stop_process_group
from sibylla.settings import Settings

__all__ = ["WorkerProcess"]


class WorkerProcess:
    """``sibylla worker`` in a child process; ``kill()`` simulates a crash.

    ``extra_env``: more ``SIBYLLA_*`` variables, e.g. the online-learning settings
    (``OnlineSettings.to_env()``: the trainer's public key, the models directory).
    """

    def __init__(self, settings: Settings, log_path: Path,
                 extra_env: Mapping[str, str] | None = None) -> None:
        self.settings = settings
        self.log_path = log_path
        self.extra_env = dict(extra_env or {})
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, ready_timeout_s: float = 120.0) -> WorkerProcess:
        """Start it and wait until *its* HTTP server answers.

        The metrics name the worker's pid, so another server that happens to hold the port is
        not taken for this worker; if the port was taken, the worker is restarted on another.
        """
        for _ in range(3):
            if self._start_once(ready_timeout_s):
                return self
            self.settings = dataclasses.replace(self.settings, web_port=free_port())
        raise RuntimeError(f"worker could not bind a web port:\n{self.tail()}")

    def _start_once(self, ready_timeout_s: float) -> bool:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as out:
            this_try = out.tell()  # the log is shared by the tries: read only this one's
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "sibylla", "worker"], stdout=out,
                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                preexec_fn=die_with_parent,
                env={**os.environ, **self.extra_env, **self.settings.to_env()})
        mine = f'sibylla_worker_info{{pid="{self.proc.pid}"}}'
        deadline = time.monotonic() + ready_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                # Searched in all this try wrote: the shutdown that follows the bind error
                # logs more than a tail's worth.
                with open(self.log_path, "rb") as log_file:
                    log_file.seek(this_try)
                    if b"address already in use" in log_file.read():
                        return False
                raise RuntimeError(f"worker exited with {self.proc.returncode}:\n{self.tail()}")
            try:
                if mine in self.metrics_text():
                    return True
            except OSError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"worker not ready within {ready_timeout_s:.0f}s:\n{self.tail()}")

    def metrics_text(self) -> str:
        url = f"http://{self.settings.web_host}:{self.settings.web_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.read().decode()

    def tail(self, chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def kill(self) -> None:
        """SIGKILL: no shutdown, no final commit (a crash)."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM and wait (a graceful leave: the group rebalances at once)."""
        if self.proc is not None:
            stop_process_group(self.proc, timeout_s)

    def __enter__(self) -> WorkerProcess:
        if self.proc is None or self.proc.poll() is not None:
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
