"""Talking to Slurm through ``scontrol``, with a bound on every call.

Both the epilog (run by slurmctld for every job) and the actuator call scontrol; a hung call
must never hold slurmctld's epilog thread or stall the actuator, so every call has a timeout and
a failure is a :class:`SlurmError` with scontrol's own message.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Mapping, Sequence
from datetime import datetime

__all__ = ["Scontrol", "SlurmError", "parse_job", "timestamp"]

# A field of `scontrol show job -o`: a key after a space (values such as TRES hold '=' but no
# space before it), up to the next key.
_KEY = re.compile(r"(?:^|\s)([A-Za-z][\w:/.()-]*)=")


# Node states (and flags) of `scontrol show node` under which a node takes no new job.
_TAKES_NO_JOB = frozenset({"DOWN", "DRAIN", "DRAINED", "DRAINING", "FAIL", "FAILING",
                           "FUTURE"})


class SlurmError(RuntimeError):
    """An scontrol call failed or timed out; the message says which and why."""


def parse_job(line: str) -> dict[str, str]:
    """The fields of one job from ``scontrol show job -o`` (one line per job; also a
    partition, a node or a reservation of ``scontrol show partition|node|reservation -o``)."""
    fields: dict[str, str] = {}
    keys = list(_KEY.finditer(line))
    for i, m in enumerate(keys):
        end = keys[i + 1].start() if i + 1 < len(keys) else len(line)
        fields[m.group(1)] = line[m.end():end].strip()
    return fields


def timestamp(value: str) -> float | None:
    """Epoch seconds of a Slurm time field (local time, ``2026-11-30T19:27:19``), None when
    unset (``Unknown``, ``None``, ``N/A``)."""
    try:
        return datetime.fromisoformat(value).timestamp()
    except ValueError:
        return None


class Scontrol:
    """``scontrol`` with a timeout; ``env`` (e.g. SLURM_CONF) is added to the environment."""

    def __init__(self, command: str = "scontrol", timeout_s: float = 5.0,
                 env: Mapping[str, str] | None = None) -> None:
        self.command = command
        self.timeout_s = timeout_s
        self.env = dict(env) if env else None

    def run(self, args: Sequence[str]) -> str:
        """scontrol's standard output for ``args``; :class:`SlurmError` when it fails."""
        env = {**os.environ, **self.env} if self.env else None
        try:
            done = subprocess.run([self.command, *args], capture_output=True, text=True,
                                  timeout=self.timeout_s, env=env, check=False)
        except subprocess.TimeoutExpired:
            raise SlurmError(f"scontrol {' '.join(args)}: no answer within "
                             f"{self.timeout_s:g} s") from None
        except OSError as exc:
            raise SlurmError(f"scontrol {' '.join(args)}: {exc}") from None
        if done.returncode != 0:
            message = (done.stderr or done.stdout).strip()
            raise SlurmError(f"scontrol {' '.join(args)}: {message}")
        return done.stdout

    def show_jobs(self, job_id: str) -> list[dict[str, str]]:
        """Every record scontrol prints for ``job_id`` (a job array's id: each of its tasks;
        a heterogeneous job's: each component); none when slurmctld no longer knows it."""
        try:
            out = self.run(["show", "job", "-o", job_id])
        except SlurmError as exc:
            if "Invalid job id" in str(exc):
                return []
            raise
        return [parse_job(line) for line in out.strip().splitlines()]

    def show_job(self, job_id: str) -> dict[str, str] | None:
        """The job's fields, None when slurmctld no longer knows the job. Where ``job_id`` is
        also a job array's id (the array's last task keeps it), scontrol prints every task of
        the array: the one whose ``JobId`` it is is taken."""
        jobs = self.show_jobs(job_id)
        return next((job for job in jobs if job.get("JobId") == job_id),
                    jobs[0] if jobs else None)

    def usable_nodes(self, partitions: str) -> list[str]:
        """The nodes of the partitions in ``partitions`` (a job's ``Partition``: one name, or
        several while it is pending) that take a job now: not down, drained or draining,
        failed or future (powered-down nodes are booted on demand, so they count)."""
        nodes: list[str] = []
        for name in filter(None, partitions.split(",")):
            first = self.run(["show", "partition", "-o", name]).strip().splitlines()[:1]
            members = parse_job(first[0]).get("Nodes", "") if first else ""
            if not members or members == "(null)":
                continue
            for line in self.run(["show", "node", "-o", members]).splitlines():
                node = parse_job(line)
                flags = {f.rstrip("*~#!%$@^-") for f in node.get("State", "").split("+")}
                if node.get("NodeName") and not flags & _TAKES_NO_JOB:
                    nodes.append(node["NodeName"])
        return list(dict.fromkeys(nodes))

    def active_reservations(self) -> dict[str, list[str]]:
        """The nodes of each reservation in force now (``State=ACTIVE``), by its name."""
        found: dict[str, list[str]] = {}
        for line in self.run(["show", "reservation", "-o"]).splitlines():
            reservation = parse_job(line)  # "No reservations in the system": no fields
            if reservation.get("State") == "ACTIVE" and reservation.get("ReservationName"):
                found[reservation["ReservationName"]] = self.hostnames(
                    reservation.get("Nodes", ""))
        return found

    def hostnames(self, nodelist: str) -> list[str]:
        """A compressed node list (``gpu[01-03]``) expanded to host names."""
        if not nodelist or nodelist == "(null)":
            return []
        return self.run(["show", "hostnames", nodelist]).split()
