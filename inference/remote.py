"""The model in a process of its own: a :class:`~.api.Classifier` whose forward passes do not
compete with the event loop for the interpreter lock.

In the worker, the model ran in a thread beside the event loop. Each torch operation releases
the GIL and must take it back; with the event loop busy, taking it back waits up to the
interpreter's switch interval (5 ms). A forward pass makes dozens of such operations, so at 100
failures/s a micro-batch of ~25 windows took ~250 ms of wall time for ~35 ms of CPU
(``docs/pipeline-bench.md``, finding 17), and the decide path waited on it. In a child
process the pass runs on its own interpreter: the worker's inference thread only pickles the
windows, blocks on the pipe (GIL released) and unpickles the predictions. The worker process
itself no longer imports torch.

The child is started with ``spawn`` (no copy of the worker's threads, sockets or event loop),
loads the model, says which one, then answers one batch at a time until its pipe closes: it
exits when the worker does, however the worker ends (a SIGKILL included: the pipe's end
closes with the process). A child that dies is started again on the next batch; the batch it
died on fails, and its requests stay pending until the timer asks again.
"""

from __future__ import annotations

import logging
import multiprocessing
import signal
import threading
from collections.abc import Sequence
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

from sibylla.collector import tune_collector

from .api import LogWindow, Prediction

__all__ = ["ModelProcessError", "ProcessClassifier"]

log = logging.getLogger(__name__)


class ModelProcessError(RuntimeError):
    """The model's process died or could not load the model."""


def _serve(conn: Connection, model_path: str | None, device: str, min_confidence: float,
           threads: int) -> None:
    """The child: load the model, report (True, what it loaded) or (False, error), then answer
    each batch with (True, predictions) or (False, error) until the pipe closes."""
    # The worker decides when to stop: a Ctrl-C sent to the whole process group must not kill
    # the model under a worker that is still draining its last batches.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        import torch

        from .engine import load_classifier

        torch.set_num_threads(threads)
        classifier = load_classifier(model_path, device, min_confidence)
        tune_collector()  # torch's objects live as long as the process
    except BaseException as exc:  # noqa: BLE001 - reported to the worker, which stops
        _send_error(conn, exc)
        return
    conn.send((True, {"version": classifier.version, "meta": classifier.meta,
                      "device": str(classifier.device), "threads": torch.get_num_threads(),
                      "threshold": classifier.threshold}))
    while True:
        try:
            windows = conn.recv()
        except (EOFError, OSError):  # the worker is gone
            return
        try:
            conn.send((True, classifier.predict(windows)))
        except Exception as exc:  # noqa: BLE001 - this batch fails, the next may not
            _send_error(conn, exc)


def _send_error(conn: Connection, exc: BaseException) -> None:
    """``exc`` to the worker, or its text when it does not pickle."""
    try:
        conn.send((False, exc))
    except Exception:  # noqa: BLE001 - pickling failed: the message still says what went wrong
        conn.send((False, ModelProcessError(f"{type(exc).__name__}: {exc}")))


class ProcessClassifier:
    """A :class:`~.engine.ModelClassifier` loaded and run in a child process (see module
    docstring). Constructing it blocks until the model is loaded; ``predict`` blocks until the
    batch is decided (call it from a thread, as the micro-batcher does)."""

    def __init__(self, model_path: str | None = None, device: str = "auto",
                 min_confidence: float = 0.0, threads: int = 1) -> None:
        self._args = (model_path, device, min_confidence, threads)
        self._lock = threading.Lock()  # one batch in flight; the pipe carries one at a time
        self._process: BaseProcess | None = None
        self._conn: Connection | None = None
        self.meta: dict[str, Any] = {}
        self._version = ""
        self.device = ""  # where the model runs: "cpu" or "cuda"
        self.threads = 0  # torch's threads in the model process
        self.threshold = 0.0  # the confidence below which the verdict is unknown
        self._start()

    def _start(self) -> None:
        ctx = multiprocessing.get_context("spawn")
        parent, child = ctx.Pipe()
        process = ctx.Process(target=_serve, args=(child, *self._args), name="sibylla-model",
                              daemon=True)
        process.start()
        child.close()  # the child's end lives in the child only: its death closes the pipe
        try:
            reply = parent.recv()
        except EOFError:
            process.join(5)
            raise ModelProcessError(
                f"the model process exited with code {process.exitcode} before loading "
                "the model") from None
        if not reply[0]:
            process.join(5)
            raise reply[1]
        loaded = reply[1]
        version = loaded["version"]
        if self._version and version != self._version:
            parent.close()  # the file changed under a running worker: not the same model
            process.kill()
            raise ModelProcessError(f"the model process loaded {version}, not {self._version}")
        self._process, self._conn = process, parent
        self._version, self.meta = version, loaded["meta"]
        self.device, self.threads, self.threshold = (loaded["device"], loaded["threads"],
                                                     loaded["threshold"])
        log.info("loaded classifier %s in process %d on %s (threshold %.3f)", version,
                 process.pid, self.device, self.threshold)

    @property
    def version(self) -> str:
        return self._version

    @property
    def pid(self) -> int | None:
        """The model process's PID (None while none runs)."""
        return None if self._process is None else self._process.pid

    def predict(self, windows: Sequence[LogWindow]) -> list[Prediction]:
        with self._lock:
            if self._conn is None:  # the last one died: a new one (its load blocks)
                log.warning("starting the model process again")
                self._start()
            assert self._conn is not None
            try:
                self._conn.send(list(windows))
                reply = self._conn.recv()
            except (EOFError, OSError) as exc:
                process = self._detach()
                if process is not None:
                    process.join(1)
                    log.error("the model process (pid %s) ended with code %s", process.pid,
                              process.exitcode)
                raise ModelProcessError(f"the model process died: {exc!r}") from None
        if not reply[0]:
            raise reply[1]
        predictions: list[Prediction] = reply[1]
        return predictions

    def _detach(self) -> BaseProcess | None:
        """Forget the model process and close its pipe (a live one then exits by itself)."""
        process, self._process, conn, self._conn = self._process, None, self._conn, None
        if conn is not None:
            conn.close()
        return process

    def close(self) -> None:
        """Stop the model process (it also stops by itself when this process ends)."""
        with self._lock:
            process = self._detach()
            if process is not None:
                process.join(1)  # it exits on its closed pipe; killed if it does not
                if process.is_alive():
                    process.kill()
                    process.join(5)
