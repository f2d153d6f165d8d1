"""What the decide path reads in a window's text besides the model's verdict, read off the
event loop, in a process of its own.

A decision needs more of a window than the model's prediction: the policy with memory compares
the attempt's progress and root cause with the job's earlier attempts (``attempts.py``), and
online learning keeps the window's redacted text and error signature for its votes
(``online_learning/votes.py``). Each is a scan of the window's text with regular expressions,
~1.2 ms per window of 200 lines. Done on the event loop, they were a quarter of its busy time
at 100 failures/s (py-spy; ``docs/pipeline-bench.md``, finding 18), and every queue of the
worker waited on them. Done in the model's process after the forward pass, they doubled each
micro-batch's time, and the decide path waited on that instead.

So :class:`WindowReader` runs :func:`read_window` in a process of its own, on a micro-batch's
windows while the model runs on the same batch: with a core to spare the two take the time of
the slower, and the event loop only combines the results with the job's facts (its nodes, its
history). On the 2-core benchmark box, shared with the broker, the batch's time grew instead
(the reader waits for a core); what the worker keeps up with still rose (finding 18). A batch
of fewer than :data:`PROCESS_FROM_WINDOWS` windows is read in the caller (the inference thread)
instead: the hop to the reader process and back passes through the executor's threads, each
waiting for the interpreter lock, which made lone failures slower (up to 117 ms against 81 on
Apache Kafka), while a few windows read in place cost a few ms of a loop that is then nearly
idle. A reader process that dies costs nothing but time: that batch is read in the caller and
the next batch starts another process.
"""

from __future__ import annotations

import logging
import multiprocessing
import multiprocessing.connection
import os
import signal
import threading
from collections.abc import Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass

from sibylla.collector import tune_collector
from sibylla.inference.api import LogWindow
from sibylla.online_learning.votes import error_signature, window_text
from sibylla.streams.attempts import cause_line, hardware_lines, progress_of, template

__all__ = ["PROCESS_FROM_WINDOWS", "WindowReader", "WindowReading", "read_window"]

log = logging.getLogger(__name__)

PROCESS_FROM_WINDOWS = 8  # smaller batches are read in the calling thread (module docstring)


@dataclass(frozen=True, slots=True)
class WindowReading:
    """The facts of one window's text that a decision and its label need (picklable)."""

    progress: tuple[int, int, int]  # (highest epoch, highest step, checkpoints saved)
    cause_template: str | None  # the root-cause line's template; None: the window is empty
    hardware_lines: tuple[str, ...]  # the lines naming a hardware fault (usually none)
    text: str  # redacted: what a label carries (votes.window_text)
    signature: str  # the first error message, masked (votes.error_signature)


def read_window(window: LogWindow) -> WindowReading:
    """Read ``window`` once for everything the decide path needs of its text."""
    return WindowReading(
        progress=progress_of(window.tail),
        cause_template=None if window.empty else template(cause_line(window)),
        hardware_lines=hardware_lines([*window.first_error, *window.tail]),
        text=window_text(window),
        signature=error_signature(window),
    )


def read_windows(windows: Sequence[LogWindow]) -> list[WindowReading]:
    return [read_window(w) for w in windows]


def _init_reader_process() -> None:
    """In the reader process: outlive no worker, and let the worker decide when to stop (a
    Ctrl-C sent to the whole process group must not end the reader under a worker that is
    still draining its last batches). The pool's call queue does not tell a reader that the
    worker is gone (the reader holds a write end of it too): seen left running after a
    SIGKILL of the worker, so it watches the worker's process sentinel instead."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    parent = multiprocessing.parent_process()
    if parent is not None:
        threading.Thread(target=_exit_with, args=(parent.sentinel,), daemon=True,
                         name="sibylla-reader-parent-watch").start()
    tune_collector()


def _exit_with(sentinel: int) -> None:
    multiprocessing.connection.wait([sentinel])
    os._exit(0)


class WindowReader:
    """:func:`read_windows` in a child process (see the module docstring). Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pool: ProcessPoolExecutor | None = None

    def start(self) -> None:
        """Start the process now (its imports take a few hundred ms), not on the first batch."""
        self.result(self._in_process([]), [])

    def submit(self, windows: Sequence[LogWindow]) -> Future[list[WindowReading]]:
        """Start reading ``windows`` (a small batch: read now); :meth:`result` waits for the
        readings."""
        if len(windows) < PROCESS_FROM_WINDOWS:
            done: Future[list[WindowReading]] = Future()
            done.set_result(read_windows(windows))
            return done
        return self._in_process(windows)

    def _in_process(self, windows: Sequence[LogWindow]) -> Future[list[WindowReading]]:
        with self._lock:
            pool = self._pool = self._pool or self._new_pool()
        try:
            return pool.submit(read_windows, list(windows))
        except RuntimeError as exc:  # broken or shut down: read here (result() does)
            failed: Future[list[WindowReading]] = Future()
            failed.set_exception(exc)
            return failed

    def result(self, reading: Future[list[WindowReading]], windows: Sequence[LogWindow]
               ) -> list[WindowReading]:
        """The readings of a :meth:`submit`; read here instead when the process failed (the
        next batch gets a new one)."""
        try:
            return reading.result()
        except Exception:  # noqa: BLE001 - a broken pool, a pickling error: read in-process
            log.warning("the window reader process failed; read %d windows in the worker",
                        len(windows), exc_info=True)
            self._discard()
            return read_windows(windows)

    @staticmethod
    def _new_pool() -> ProcessPoolExecutor:
        # spawn: no copy of the worker's threads, sockets or event loop.
        return ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"),
                                   initializer=_init_reader_process)

    def read(self, windows: Sequence[LogWindow]) -> list[WindowReading]:
        return self.result(self.submit(windows), windows)

    def _discard(self, wait: bool = False) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=wait, cancel_futures=True)

    def close(self) -> None:
        """Stop the process, once done with the batch it may be reading (it also stops by
        itself when this process ends)."""
        self._discard(wait=True)
