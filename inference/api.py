"""The classifier contract between the stream agents and the models.

The agents hand a micro-batch of :class:`LogWindow` to a :class:`Classifier` and get one
:class:`Prediction` per window back. Nothing here knows about Kafka, so the models can be
trained, evaluated and used from the command line without a broker.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable

__all__ = [
    "ERROR_START",
    "Classifier",
    "LogWindow",
    "Prediction",
    "VerdictLabel",
    "is_error_start",
]

VerdictLabel = Literal["deterministic", "nondeterministic", "unknown"]

# The first line of an error report: a Python traceback, an exception line, a launcher's or
# NCCL's error banner, a CUDA/driver fault, a killed process. The stream agent keeps the block
# that starts at the first such line because the root cause is often printed long before the job
# dies, and the tail then fills with teardown noise from other ranks. One alternation compiled
# once: it runs on every ingested line, so it must cost about a microsecond.
ERROR_START = re.compile(
    r"Traceback \(most recent call last\)"
    r"|\b(?:[A-Z][A-Za-z]*(?:Error|Exception)|KeyboardInterrupt|SystemExit)\b(?::|$)"
    r"|\b(?:ERROR|FATAL|CRITICAL|Fatal error|Segmentation fault|Killed)\b"
    r"|\bNCCL (?:WARN|ERROR)\b|ncclInternalError|ncclSystemError|ncclUnhandled"
    r"|CUDA error|CUDA out of memory|out of memory|\bXid\b|ECC error"
    r"|\berror:"
    r"|srun: error|slurmstepd: error|\bexited with (?:exit )?code [1-9]"
    r"|terminate called after throwing|Watchdog caught collective|\bLoss is (?:nan|inf)\b"
    r"|\bDUE TO (?:NODE FAILURE|PREEMPTION|TIME LIMIT)"
)


# Literals at least one of which every ERROR_START match contains. Python's regex engine tries
# each branch of ERROR_START at every position (about 40 us on a 90-character progress line);
# a plain alternation of literals rejects the 99% of lines that open nothing in about 2 us.
_ERROR_START_LITERALS = re.compile("|".join(map(re.escape, (
    "Traceback", "Error", "Exception", "KeyboardInterrupt", "SystemExit", "ERROR", "FATAL",
    "CRITICAL", "Fatal error", "Segmentation fault", "Killed", "NCCL WARN", "ncclUnhandled",
    "CUDA error", "out of memory", "Xid", "ECC error", "error", "exited with",
    "terminate called after throwing", "Watchdog caught collective", "Loss is", "DUE TO",
))))


def _opens_error_report(line: str) -> bool:
    return (_ERROR_START_LITERALS.search(line) is not None
            and ERROR_START.search(line) is not None)


# Every ASCII digit as 0, for bytes.translate (~10x faster than str.translate); the line
# templates of preprocess.py start from the same shape.
DIGITS_AS_ZERO = bytes.maketrans(b"123456789", b"000000000")

# The answer per digit shape of a plain ASCII line (every digit 0). ERROR_START treats the
# digits alike (they are all word characters, and its literals hold none) except in "exited
# with code [1-9]", so a shape decides for every line of it, but for lines saying "exited
# with". Training and progress lines repeat a few shapes (26 in the pipeline benchmark's
# 60,000 lines): a line then costs an encode, a translate and a dict lookup, ~0.5 us against
# ~1.2-2 us for the two searches, on every line the stream ingests.
_OPENS_BY_SHAPE: dict[bytes, bool] = {}
_SHAPES_KEPT = 1 << 14  # ~3 MB of 100-character shapes; emptied when full


def is_error_start(line: str) -> bool:
    """True when ``line`` opens an error report (see :data:`ERROR_START`)."""
    if not line.isascii():
        return _opens_error_report(line)
    shape = line.encode("ascii").translate(DIGITS_AS_ZERO)
    known = _OPENS_BY_SHAPE.get(shape)
    if known is not None:
        return known
    opens = _opens_error_report(line)
    if b"exited with" not in shape:  # the one rule that reads a digit's value
        if len(_OPENS_BY_SHAPE) >= _SHAPES_KEPT:
            _OPENS_BY_SHAPE.clear()
        _OPENS_BY_SHAPE[shape] = opens
    return opens


@dataclass(frozen=True, slots=True)
class LogWindow:
    """What the stream kept of one job attempt's output.

    ``tail`` holds the last lines in the order printed, bounded by lines and bytes;
    ``first_error`` the first error block seen (it may also be part of the tail);
    ``line_count`` every line the attempt printed, kept or not.
    """

    job_id: str
    attempt: int
    tail: list[str]
    first_error: list[str] = field(default_factory=list)
    line_count: int = 0

    @property
    def empty(self) -> bool:
        """No non-blank line: nothing to judge ("no log" for the model, the baselines and the
        pipeline's policy alike)."""
        return not any(line.strip() for line in itertools.chain(self.first_error, self.tail))


@dataclass(frozen=True, slots=True)
class Prediction:
    """A model's judgement of one window.

    ``confidence`` is the calibrated probability of ``verdict`` (for ``unknown``, of the class
    the model leaned to); ``evidence`` the few lines that drove it, already masked of secrets.
    """

    verdict: VerdictLabel
    confidence: float
    category: str
    evidence: list[str]


@runtime_checkable
class Classifier(Protocol):
    """Anything that turns a micro-batch of windows into predictions.

    ``predict`` blocks (it may run a GPU kernel), so the agents call it from a worker thread,
    never from the event loop.
    """

    @property
    def version(self) -> str:
        """Identifies the model in every decision it makes."""
        ...

    def predict(self, windows: Sequence[LogWindow]) -> list[Prediction]:
        """One prediction per window, in order."""
        ...
