"""The window reader reads in a process of its own what the decide path needs of a window's
text, and a reader process that dies costs no reading."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from sibylla.inference.api import LogWindow
from sibylla.streams.reading import PROCESS_FROM_WINDOWS, WindowReader, read_window

ERROR = ["[rank0]: Traceback (most recent call last):",
         "[rank0]: RuntimeError: mat1 and mat2 shapes cannot be multiplied (4x3 and 5x6)"]
TRAINING = ["epoch 2 step 900 loss 0.41", "saved checkpoint to /ckpt/epoch2 (token=hunter2)"]


def windows() -> list[LogWindow]:
    """A micro-batch large enough to be read in the reader process."""
    lines = TRAINING + ERROR
    three = [LogWindow("shape", 0, lines, ERROR, len(lines)),
             LogWindow("xid", 1, ["gpu07: NVRM: Xid 79: GPU has fallen off the bus"]),
             LogWindow("silent", 0, [])]
    return three * (PROCESS_FROM_WINDOWS // 3 + 1)


@pytest.fixture
def reader() -> Iterator[WindowReader]:
    reader = WindowReader()
    reader.start()
    yield reader
    reader.close()


def _reader_pid(reader: WindowReader) -> int:
    pool = reader._pool
    assert pool is not None
    [pid] = pool._processes  # type: ignore[attr-defined]  # one process: its pid
    return int(pid)


def test_the_reader_process_reads_what_the_worker_would(reader: WindowReader) -> None:
    assert _reader_pid(reader) != os.getpid()
    read = reader.read(windows())
    assert read == [read_window(w) for w in windows()]
    shape, xid, silent = read[:3]
    assert shape.progress == (2, 900, 1)
    assert shape.cause_template is not None and "shapes cannot be multiplied" in (
        shape.cause_template)
    assert "hunter2" not in shape.text and "RuntimeError: mat1" in shape.text
    assert xid.hardware_lines == ("gpu07: NVRM: Xid 79: GPU has fallen off the bus",)
    assert silent.cause_template is None and silent.text == ""


def test_a_killed_reader_costs_no_reading_and_the_next_batch_starts_another(
        reader: WindowReader) -> None:
    dead = _reader_pid(reader)
    os.kill(dead, signal.SIGKILL)
    expected = [read_window(w) for w in windows()]
    assert reader.read(windows()) == expected  # read in this process this time
    assert reader.read(windows()) == expected
    assert _reader_pid(reader) != dead


def test_a_small_batch_is_read_in_place_without_waiting_for_the_process(
        reader: WindowReader, caplog: pytest.LogCaptureFixture) -> None:
    # A lone failure's window: the hop through the executor's threads cost more than reading
    # it here (the module docstring).
    dead = _reader_pid(reader)
    os.kill(dead, signal.SIGKILL)
    lone = windows()[:1]
    assert reader.read(lone) == [read_window(lone[0])]
    assert caplog.records == []  # the dead process was not asked
    assert _reader_pid(reader) == dead


def test_closing_stops_the_reader_process() -> None:
    reader = WindowReader()
    reader.start()
    pid = _reader_pid(reader)
    process = reader._pool._processes[pid]  # type: ignore[union-attr]
    reader.close()
    process.join(10)
    assert not process.is_alive()


def test_the_reader_process_does_not_outlive_a_killed_worker() -> None:
    # A worker killed with SIGKILL (the crash tests do it) left its reader running before the
    # reader watched for it.
    script = ("import os, signal; from sibylla.streams.reading import WindowReader; "
              "r = WindowReader(); r.start(); print(*r._pool._processes, flush=True); "
              "os.kill(os.getpid(), signal.SIGKILL)")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == -signal.SIGKILL
    pid = int(done.stdout.split()[0])
    deadline = time.monotonic() + 10
    while _running(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _running(pid)


def _running(pid: int) -> bool:
    """Alive and not a zombie (an orphan nobody reaps stays one here)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
