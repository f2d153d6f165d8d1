"""``sibylla slurm epilog``: Slurm's EpilogSlurmctld hook, publishing each finished attempt.

slurmctld runs it once per job attempt after the job ends, with the job in its environment
(``SLURM_JOB_ID``, ``SLURM_JOB_RESTART_COUNT``, ``SLURM_JOB_EXIT_CODE2``, ``SLURM_JOB_NODELIST``,
...). It publishes the attempt's output file as LogBatch records (the last marked ``eos``, so
the worker decides at once) and then its finished JobEvent.

Slurm gives the epilog no job-state variable, and ``EXIT_CODE2`` is ``0:0`` for a timeout, a
cancel and a node failure alike, so the state comes from ``scontrol show job`` (see
:func:`derive_state`). The attempt's output: with ``--open-mode=append`` every attempt appends
to one file, so the epilog remembers (in ``slurm_epilog_state_dir``) how far earlier attempts
shipped and sends only the new part; a file that shrank or changed there was truncated by a new
attempt and is shipped from its start.

The hook runs inside slurmctld's epilog thread: every scontrol call is bounded, the whole run
is bounded by ``slurm_epilog_timeout_s``, and a failure exits non-zero with one line on stderr
(slurmctld logs it) without touching the job. An attempt the broker did not take within the
bound (away, restarting) is kept in a spool (:mod:`sibylla.scheduler.spool`) that every later
run publishes after its own attempt: a failure that ends during a broker outage is still
decided, later.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import logging
import os
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import orjson

from sibylla.scheduler.scontrol import Scontrol, SlurmError
from sibylla.scheduler.spool import Shipment, Spool, file_safe
from sibylla.schemas.records import JobEvent
from sibylla.settings import Settings
from sibylla.streams.ship import DeliveryError, Shipper
from sibylla.streams.topics import transient_broker_error

__all__ = ["Attempt", "OutputCursor", "Spooled", "attempt_from_env", "broker_away",
           "derive_state", "drain_spool", "expand_path", "publish", "read_attempt", "read_part",
           "run_epilog"]

log = logging.getLogger(__name__)

_SIGNATURE_BYTES = 256  # bytes before the shipped offset that must be unchanged to resume
_PATTERN = re.compile(r"%(\d*)([AajJNuxnts%])")
_GPUS = re.compile(r"gres/gpu(?::[^=,]*)?=(\d+)")
_FINAL_STATES = {"COMPLETED": "COMPLETED", "FAILED": "FAILED", "TIMEOUT": "TIMEOUT",
                 "NODE_FAIL": "NODE_FAIL", "OUT_OF_MEMORY": "OUT_OF_MEMORY",
                 "CANCELLED": "CANCELLED", "PREEMPTED": "PREEMPTED", "BOOT_FAIL": "NODE_FAIL",
                 "DEADLINE": "TIMEOUT"}


def derive_state(attempt: int, exit_code2: str, job: Mapping[str, str] | None
                 ) -> tuple[str, int, int]:
    """(state, exit code, signal) of the attempt that just ended.

    ``scontrol show job`` in the epilog shows ``JobState=COMPLETING`` but a final ``Reason``
    and ``ExitCode``: ``Restarts`` above the attempt means slurmctld requeued the job itself
    (its node failed); ``Reason=TimeLimit`` is a timeout, ``OutOfMemory`` an OOM kill, signal
    15 with ``Reason=None`` a cancel; otherwise a non-zero code or signal is a failure.
    """
    code, _, sig = (exit_code2 or "0:0").partition(":")
    exit_code, signal = int(code or 0), int(sig or 0)
    if job is None:
        return ("FAILED" if exit_code or signal else "COMPLETED"), exit_code, signal
    restarts = int(job.get("Restarts", "0") or 0)
    reason = job.get("Reason", "None")
    state = job.get("JobState", "COMPLETING")
    if restarts > attempt:
        return "NODE_FAIL", exit_code, signal
    if reason.startswith("TimeLimit"):
        return "TIMEOUT", exit_code, signal
    if reason.startswith("OutOfMemory"):
        return "OUT_OF_MEMORY", exit_code, signal
    if state in _FINAL_STATES:
        return _FINAL_STATES[state], exit_code, signal
    if reason.startswith("NodeDown") or reason.startswith("NodeFail"):
        return "NODE_FAIL", exit_code, signal
    if signal == 15 and not exit_code and reason == "None":
        return "CANCELLED", exit_code, signal
    return ("FAILED" if exit_code or signal else "COMPLETED"), exit_code, signal


def expand_path(pattern: str, job: Mapping[str, str], env: Mapping[str, str],
                first_node: str) -> str:
    """An output path with sbatch's ``%`` patterns expanded (``%j`` job id, ``%x`` name, ``%u``
    user, ``%N`` first node, ``%A``/``%a`` array job/task, ``%%``); relative paths are under
    the job's working directory. scontrol usually shows them expanded already."""
    job_id = env.get("SLURM_JOB_ID", job.get("JobId", ""))
    values = {
        "j": job_id, "J": job_id, "x": env.get("SLURM_JOB_NAME", job.get("JobName", "")),
        "u": env.get("SLURM_JOB_USER", job.get("UserId", "").split("(")[0]),
        "N": first_node, "A": env.get("SLURM_ARRAY_JOB_ID", job_id),
        "a": env.get("SLURM_ARRAY_TASK_ID", "0"), "n": "0", "t": "0", "s": "batch", "%": "%",
    }

    def one(m: re.Match[str]) -> str:
        value = values[m.group(2)]
        width = m.group(1)
        return value.zfill(int(width)) if width and value.isdigit() else value

    path = _PATTERN.sub(one, pattern)
    workdir = env.get("SLURM_JOB_WORK_DIR") or job.get("WorkDir", "")
    return str(Path(workdir) / path) if workdir and not os.path.isabs(path) else path


@dataclass(frozen=True)
class OutputCursor:
    """How far earlier attempts of a job shipped one of its output files, kept in a small file
    per (job, stream), so an appended file ships only the new attempt's part."""

    state_dir: Path
    job_id: str
    stream: str

    @property
    def path(self) -> Path:
        return self.state_dir / f"{file_safe(self.job_id)}.{self.stream}.json"

    def start(self, output: Path) -> int:
        """Where this attempt's part of ``output`` begins: after what was shipped, if the bytes
        before that point are unchanged; else 0 (the file was truncated and rewritten). A file
        written since yet no longer was rewritten with the same bytes: without
        ``--open-mode=append``, a failure that prints the same log every time (most
        deterministic ones do) looks unchanged but for its modification time."""
        try:
            saved = orjson.loads(self.path.read_bytes())
        except (OSError, orjson.JSONDecodeError):
            return 0
        offset = int(saved.get("offset", 0))
        stat = output.stat()
        if saved.get("file") != str(output) or stat.st_size < offset:
            return 0
        if _signature(output, offset) != saved.get("signature"):
            return 0
        if stat.st_size == offset and stat.st_mtime_ns != saved.get("mtime_ns"):
            return 0
        return offset

    def save(self, output: Path, offset: int) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_bytes(orjson.dumps({"file": str(output), "offset": offset,
                                      "signature": _signature(output, offset),
                                      "mtime_ns": output.stat().st_mtime_ns}))
        tmp.replace(self.path)

    def forget(self) -> None:
        self.path.unlink(missing_ok=True)


def _signature(output: Path, offset: int) -> str:
    with output.open("rb") as f:
        f.seek(max(0, offset - _SIGNATURE_BYTES))
        return hashlib.sha256(f.read(min(offset, _SIGNATURE_BYTES))).hexdigest()


def read_part(output: Path, start: int, max_bytes: int, max_line_bytes: int
              ) -> tuple[list[str], int]:
    """The lines of ``output`` from ``start`` to its end, and that end. Over ``max_bytes`` only
    the first and the last half are read: the root cause is often printed early, the death at
    the end. Over-long lines are cut to ``max_line_bytes`` (the contract's limit)."""
    end = output.stat().st_size
    with output.open("rb") as f:
        f.seek(start)
        if end - start <= max_bytes:
            chunks = [f.read(end - start)]
        else:
            head = f.read(max_bytes // 2)
            f.seek(end - max_bytes // 2)
            tail = f.read(max_bytes // 2)
            chunks = [head.rpartition(b"\n")[0], tail.partition(b"\n")[2]]
    lines: list[str] = []
    for chunk in chunks:
        for raw in chunk.splitlines():
            lines.append(raw[:max_line_bytes].decode("utf-8", errors="replace"))
    return lines, end


@dataclass(frozen=True)
class Attempt:
    """A finished job attempt as the epilog publishes it."""

    event: JobEvent
    outputs: dict[str, Path]  # stream (stdout/stderr) -> file
    # A heterogeneous job's component other than its leader: the job id of the leader, whose
    # epilog publishes the attempt (slurmctld runs the epilog once per component).
    het_leader: str | None = None


def attempt_from_env(env: Mapping[str, str], scontrol: Scontrol) -> Attempt:
    """The attempt slurmctld describes in the epilog's environment, completed by scontrol."""
    job_id = env.get("SLURM_JOB_ID", "")
    if not job_id:
        raise SlurmError("SLURM_JOB_ID is not set: run this as Slurm's EpilogSlurmctld")
    attempt = int(env.get("SLURM_JOB_RESTART_COUNT", "0") or 0)
    try:
        job = scontrol.show_job(job_id)
    except SlurmError as exc:  # still publish: the state then comes from the exit code alone
        log.warning("job %s: %s; state from SLURM_JOB_EXIT_CODE2 only", job_id, exc)
        job = None
    state, exit_code, signal = derive_state(attempt, env.get("SLURM_JOB_EXIT_CODE2", ""), job)
    nodelist = env.get("SLURM_JOB_NODELIST", "")
    try:
        nodes = scontrol.hostnames(nodelist)
    except SlurmError as exc:  # a plain list needs no expanding; a compressed one stays as is
        log.warning("job %s: %s; node list kept as %s", job_id, exc, nodelist)
        nodes = [n for n in nodelist.split(",") if n]
    job = job or {}
    gpus = sum(int(g) for g in _GPUS.findall(job.get("TRES", "")))
    outputs: dict[str, Path] = {}
    for stream, field, variable in (("stdout", "StdOut", "SLURM_JOB_STDOUT"),
                                    ("stderr", "StdErr", "SLURM_JOB_STDERR")):
        pattern = job.get(field) or env.get(variable, "")
        if not pattern or pattern == "/dev/null":
            continue
        path = Path(expand_path(pattern, job, env, nodes[0] if nodes else ""))
        if path not in outputs.values():
            outputs[stream] = path
    if not outputs:  # sbatch's default: slurm-%j.out in the working directory
        outputs["stdout"] = Path(expand_path("slurm-%j.out", job, env, ""))
    event = JobEvent(job_id, attempt, "finished", state, exit_code, signal, tuple(nodes), gpus,
                     time.time())
    leader = job.get("HetJobId", "")
    return Attempt(event, outputs, leader if leader and leader != job_id else None)


def read_attempt(settings: Settings, attempt: Attempt
                 ) -> tuple[Shipment, list[tuple[OutputCursor, Path, int]]]:
    """What to publish for ``attempt``, and the cursors to save once it is safe: a failed
    attempt's new output lines by stream (a bare end-of-stream mark when there are none, so
    the worker decides without waiting); a completed one ships no lines, only its event."""
    event = attempt.event
    parts: list[tuple[str, tuple[str, ...]]] = []
    cursors: list[tuple[OutputCursor, Path, int]] = []
    for stream, output in attempt.outputs.items():
        cursor = OutputCursor(settings.slurm_epilog_state_dir, event.job_id, stream)
        if not event.failed:
            cursor.forget()  # the job is done: nothing of it is shipped again
        elif output.is_file():
            lines, end = read_part(output, cursor.start(output),
                                   settings.slurm_epilog_max_bytes, settings.max_line_bytes)
            parts.append((stream, tuple(lines)))
            cursors.append((cursor, output, end))
    if event.failed and not parts:
        parts = [("stdout", ())]
    return Shipment(event, tuple(parts)), cursors


async def publish(shipper: Shipper, shipment: Shipment,
                  lines_held: Callable[[], None] = lambda: None) -> int:
    """Ship an attempt's lines (LogBatch records, the last ``eos``), then its JobEvent once the
    broker holds the lines; the lines shipped. :class:`~sibylla.streams.ship.DeliveryError`
    when the broker refused any. ``lines_held`` is called once the broker holds the lines, so
    that a caller keeping the attempt for later keeps only its event from then on."""
    event = shipment.event
    host = event.nodes[0] if event.nodes else None
    for i, (stream, lines) in enumerate(shipment.parts):
        await shipper.send_lines(event.job_id, lines, event.attempt,
                                 eos=i == len(shipment.parts) - 1, stream=stream, host=host)
    # The termination only once the broker holds the lines: the worker decides when it
    # sees it, and must never decide on a log still in flight or refused.
    await shipper.flush()
    lines_held()
    await shipper.send_event(event)
    await shipper.flush()
    return sum(len(lines) for _, lines in shipment.parts)


def broker_away(exc: BaseException) -> bool:
    """Did publishing fail because the broker did not answer in time (worth keeping for a
    later run), rather than because it refused the records (which it always will)?"""
    if isinstance(exc, DeliveryError) and exc.__cause__ is not None:
        return broker_away(exc.__cause__)
    return transient_broker_error(exc)


async def _publish_spooled(settings: Settings, spool: Spool, deadline: float) -> int:
    """Publish what the spool holds, oldest first, until it is empty or ``deadline``; the
    attempts published. The broker away ends it quietly (what is left stays for the next
    run); an attempt it refuses is set aside, not tried again ahead of the others."""
    done = 0
    with spool.draining() as mine:
        if not mine:
            return 0
        try:
            async with Shipper(settings, request_timeout_ms=_timeout_ms(deadline)) as shipper:
                for path in spool.paths():
                    if time.monotonic() >= deadline:
                        break
                    shipment = spool.load(path)
                    if shipment is None:
                        continue
                    try:
                        await asyncio.wait_for(
                            publish(shipper, shipment, functools.partial(
                                spool.rewrite, path, shipment.without_lines())),
                            deadline - time.monotonic())
                    except Exception as exc:
                        if broker_away(exc):
                            raise
                        spool.set_aside(path, exc)
                        continue
                    path.unlink()
                    done += 1
        except Exception as exc:  # noqa: BLE001 - the spool waits for the next run
            log.warning("spooled attempts left for a later run: %s: %s", type(exc).__name__,
                        exc)
    return done


def _spool(settings: Settings) -> Spool:
    return Spool(settings.slurm_epilog_state_dir / "spool")


def _timeout_ms(deadline: float) -> int:
    return max(1, int((deadline - time.monotonic()) * 1000))


def drain_spool(settings: Settings) -> tuple[int, int]:
    """Publish what the spool holds within ``slurm_epilog_timeout_s``, as an epilog run does
    after its own attempt (for a cron job on the controller, or after a broker outage, so
    that spooled failures need not wait for the next job to end); (published, left)."""
    spool = _spool(settings)
    deadline = time.monotonic() + settings.slurm_epilog_timeout_s
    published = asyncio.run(_publish_spooled(settings, spool, deadline)) if spool.paths() else 0
    return published, len(spool.paths())


class Spooled(RuntimeError):
    """The broker was away: the attempt is kept in the spool for a later epilog run."""


def run_epilog(settings: Settings, env: Mapping[str, str]) -> str:
    """Publish the attempt in ``env``, then what earlier runs spooled, all within
    ``slurm_epilog_timeout_s`` (scontrol calls included); a one-line summary.

    An attempt the broker did not take in time is spooled (:class:`Spooled`); one it refused
    is not (the error propagates, nothing is saved), as it would be refused again."""
    deadline = time.monotonic() + settings.slurm_epilog_timeout_s
    scontrol = Scontrol(settings.slurm_scontrol,
                        min(settings.slurm_command_timeout_s, settings.slurm_epilog_timeout_s))
    attempt = attempt_from_env(env, scontrol)
    if time.monotonic() >= deadline:
        raise TimeoutError("scontrol took the whole epilog time")
    spool = _spool(settings)
    if attempt.het_leader is not None:
        # One decision per job: a second one, for this component, would be applied to a job
        # id scontrol refuses to requeue ("Job not heterogeneous job leader").
        return (f"sibylla epilog: job {attempt.event.job_id}: a component of heterogeneous job "
                f"{attempt.het_leader}, whose epilog publishes the attempt; nothing published"
                + _publish_late(settings, spool, deadline))
    shipment, cursors = read_attempt(settings, attempt)

    lines_held = asyncio.Event()

    async def publish_attempt() -> int:
        async with Shipper(settings, request_timeout_ms=_timeout_ms(deadline)) as shipper:
            return await publish(shipper, shipment, lines_held.set)

    e = attempt.event
    try:
        shipped = asyncio.run(asyncio.wait_for(publish_attempt(), deadline - time.monotonic()))
    except Exception as exc:
        if not broker_away(exc):
            raise
        held = lines_held.is_set()
        path = spool.put(shipment.without_lines() if held else shipment)
        for cursor, output, end in cursors:  # the spool (or the broker) holds these lines now
            cursor.save(output, end)
        kept = "its event (the broker holds its lines)" if held else "its lines and event"
        raise Spooled(f"broker away ({type(exc).__name__}: {exc}); job {e.job_id} attempt "
                      f"{e.attempt}: {kept} kept in {path} for a later epilog run") from exc
    for cursor, output, end in cursors:
        cursor.save(output, end)
    return (f"sibylla epilog: job {e.job_id} attempt {e.attempt} {e.state} "
            f"(exit {e.exit_code}:{e.signal}) on {','.join(e.nodes) or '-'}: "
            f"{shipped} lines shipped" + _publish_late(settings, spool, deadline))


def _publish_late(settings: Settings, spool: Spool, deadline: float) -> str:
    """Publish what earlier runs spooled; the summary's ending that says how many."""
    late = asyncio.run(_publish_spooled(settings, spool, deadline)) if spool.paths() else 0
    return f"; {late} spooled attempt(s) published" if late else ""
