"""A real Slurm cluster for the tests: munged, slurmctld and two slurmd on this host.

Everything lives under one temp dir and runs as plain child processes (no systemd), stopped by
PID at teardown. Two nodes (``node1``, ``node2``) are two slurmd started with ``-N`` on their
own ports, so a job sent elsewhere has somewhere to go. What works in a container here:
``proctrack/linuxproc`` and ``task/none`` (no cgroup plugin needed), one CPU and 100 MB per job
by default, the backfill scheduler every second.
"""

from __future__ import annotations

import os
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from sibylla.brokers.process import die_with_parent, free_port, stop_process_group
from sibylla.scheduler.scontrol import Scontrol, SlurmError

__all__ = ["BINARIES", "SlurmCluster", "missing_binaries"]

BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "scontrol", "sinfo")
NODES = ("node1", "node2")


def missing_binaries() -> list[str]:
    return [b for b in BINARIES if shutil.which(b) is None]


class SlurmCluster:
    """Start with :meth:`start`, stop with :meth:`stop`; ``epilog_env`` is exported to the
    EpilogSlurmctld wrapper, which runs ``sibylla slurm epilog`` with this interpreter."""

    def __init__(self) -> None:
        # Short paths: the munge socket path must fit a sockaddr_un (108 bytes).
        self.root = Path(tempfile.mkdtemp(prefix="sib-slurm-"))
        self.conf = self.root / "slurm.conf"
        self.procs: list[subprocess.Popen[bytes]] = []
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        self.scontrol = Scontrol("scontrol", 10.0, {"SLURM_CONF": str(self.conf)})

    # ------------------------------------------------------------------ life cycle
    def start(self) -> SlurmCluster:
        for d in ("munge", "state", "log", "out", "epilog-state", *(f"spool/{n}" for n in NODES)):
            (self.root / d).mkdir(parents=True)
        (self.root / "munge").chmod(0o755)
        key = self.root / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        self.configure_epilog({})
        self._write_conf()
        m = self.root / "munge"
        self._spawn(["munged", "--foreground", "--force", f"--key-file={key}",
                     f"--socket={m / 'munge.socket.2'}", f"--pid-file={m / 'munged.pid'}",
                     f"--log-file={m / 'munged.log'}", f"--seed-file={m / 'seed'}"], "munged")
        self._wait(lambda: (m / "munge.socket.2").exists(), 10, "munged socket")
        self._spawn(["slurmctld", "-i", "-D"], "slurmctld")
        for node in NODES:
            self._spawn(["slurmd", "-D", "-N", node], f"slurmd-{node}")
        self._wait(self._all_idle, 60, "both nodes idle in sinfo")
        return self

    def stop_controller(self) -> None:
        """Stop slurmctld (SIGTERM: it saves its state, as in a restart or an upgrade)."""
        controller = next(p for p in self.procs if p.args[0] == "slurmctld")
        stop_process_group(controller, 10.0)
        self.procs.remove(controller)

    def start_controller(self) -> None:
        """Start slurmctld again on its saved state; returns once both nodes are idle."""
        self._spawn(["slurmctld", "-i", "-D"], "slurmctld")
        self._wait(self._all_idle, 60, "both nodes idle in sinfo after the restart")

    def stop(self) -> None:
        for proc in reversed(self.procs):
            stop_process_group(proc, 10.0)
        self.procs.clear()
        shutil.rmtree(self.root, ignore_errors=True)

    def _spawn(self, argv: list[str], name: str) -> None:
        out = open(self.root / "log" / f"{name}.out", "ab")  # noqa: SIM115 - closed by the child
        self.procs.append(subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                           stdin=subprocess.DEVNULL, env=self.env,
                                           start_new_session=True, preexec_fn=die_with_parent))
        out.close()

    def _wait(self, ready: Callable[[], bool], timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for proc in self.procs:
                if proc.poll() is not None:
                    raise RuntimeError(f"{proc.args[0]} exited with {proc.returncode}:\n"
                                       + self.logs())
            if ready():
                return
            time.sleep(0.2)
        raise RuntimeError(f"Slurm: no {what} within {timeout_s:g} s:\n" + self.logs())

    def _all_idle(self) -> bool:
        done = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %t"], capture_output=True,
                              text=True, env=self.env, check=False)
        states = dict(line.split() for line in done.stdout.splitlines() if line.strip())
        return all(states.get(n) == "idle" for n in NODES)

    def logs(self) -> str:
        """The end of every daemon's and the epilog's log, for a failure message."""
        parts = []
        for path in sorted((self.root / "log").glob("*")):
            text = path.read_text(errors="replace")
            parts.append(f"--- {path.name}\n{text[-3000:]}")
        return "\n".join(parts)

    # ------------------------------------------------------------------ configuration
    def configure_epilog(self, env: Mapping[str, str]) -> None:
        """(Re)write the EpilogSlurmctld wrapper with these variables (a test's SIBYLLA_*
        settings); slurmctld reads the script anew for every job. Its state (cursors, spool)
        stays under the cluster's directory unless ``env`` says otherwise."""
        env = {"SIBYLLA_SLURM_EPILOG_STATE_DIR": str(self.root / "epilog-state"), **env}
        exports = "\n".join(f"export {k}={shlex.quote(v)}" for k, v in env.items())
        script = self.root / "epilog.sh"
        script.write_text(
            "#!/bin/sh\n"
            f"export SLURM_CONF={shlex.quote(str(self.conf))}\n"  # not set for this hook
            f"{exports}\n"
            f"exec {shlex.quote(sys.executable)} -m sibylla slurm epilog "
            f">> {shlex.quote(str(self.root / 'log' / 'epilog.log'))} 2>&1\n")
        script.chmod(0o755)

    def _write_conf(self) -> None:
        host, r = socket.gethostname(), self.root
        nodes = "\n".join(
            f"NodeName={n} NodeHostname={host} NodeAddr=127.0.0.1 Port={free_port()} CPUs=2 "
            "RealMemory=1000" for n in NODES)
        self.conf.write_text(f"""\
ClusterName=sibyllatest
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={free_port()}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={r}/munge/munge.socket.2
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=100
SchedulerParameters=bf_interval=1
JobRequeue=1
ReturnToService=2
StateSaveLocation={r}/state
SlurmdSpoolDir={r}/spool/%n
SlurmctldPidFile={r}/slurmctld.pid
SlurmdPidFile={r}/slurmd-%n.pid
SlurmctldLogFile={r}/log/slurmctld.log
SlurmdLogFile={r}/log/slurmd-%n.log
EpilogSlurmctld={r}/epilog.sh
{nodes}
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
""")

    def resume_nodes(self) -> None:
        """Bring downed nodes back (ReturnToService may have done it already)."""
        for node in NODES:
            try:
                self.scontrol.run(["update", f"nodename={node}", "state=resume"])
            except SlurmError:
                pass  # not down: nothing to resume

    # ------------------------------------------------------------------ jobs
    def sbatch(self, script: str, name: str, *options: str) -> str:
        """Submit a shell script (its output appended to out/<name>-<job id>.out); its id."""
        path = self.root / f"{name}.sh"
        path.write_text("#!/bin/sh\n" + script)
        done = subprocess.run(
            ["sbatch", "--parsable", "--open-mode=append", "-J", name,
             "-o", str(self.root / "out" / f"{name}-%j.out"), *options, str(path)],
            capture_output=True, text=True, env=self.env, check=True)
        return done.stdout.strip().split(";")[0]

    def job(self, job_id: str) -> dict[str, str]:
        job = self.scontrol.show_job(job_id)
        assert job is not None, f"slurmctld does not know job {job_id}"
        return job

    def wait_array_failed(self, array_id: str, count: int, timeout_s: float = 60.0
                          ) -> list[dict[str, str]]:
        """The ``count`` tasks of a job array once every one of them has failed."""
        deadline = time.monotonic() + timeout_s
        tasks = self.scontrol.show_jobs(array_id)
        while len(tasks) < count or any(t["JobState"] != "FAILED" for t in tasks):
            assert time.monotonic() < deadline, (tasks, self.logs())
            time.sleep(0.3)
            tasks = self.scontrol.show_jobs(array_id)
        return tasks

    def wait_job(self, job_id: str, ready: Callable[[dict[str, str]], bool],
                 timeout_s: float = 120.0) -> dict[str, str]:
        """The job once ``ready`` holds for its fields; AssertionError with the logs if not."""
        deadline = time.monotonic() + timeout_s
        job = self.job(job_id)
        while time.monotonic() < deadline:
            job = self.job(job_id)
            if ready(job):
                return job
            time.sleep(0.3)
        raise AssertionError(f"job {job_id} stuck at {job}\n{self.logs()}")
