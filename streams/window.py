"""The bounded per-attempt log window: the tail plus the first error block.

A job can print gigabytes; Sibylla keeps only what the classifier needs, so a window's memory
never exceeds its limits however much the job prints:

- the *tail*: the last ``max_lines`` lines and at most ``max_bytes`` bytes of them;
- the *first error block*: up to ``first_error_max_lines`` lines starting at the first line
  that opens an error report. The root cause is often printed long before a distributed job
  dies, and the tail then fills with teardown noise from the other ranks.

Persisting windows (incrementally, in chunks) is :mod:`sibylla.streams.window_store`'s job.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

from sibylla.inference.api import LogWindow, is_error_start
from sibylla.settings import Settings

__all__ = ["DEFAULT_LIMITS", "TailWindow", "WindowLimits"]

# States of the first error block.
_FE_NONE, _FE_OPEN, _FE_CLOSED = 0, 1, 2


@dataclass(frozen=True, slots=True)
class WindowLimits:
    max_lines: int
    max_bytes: int
    first_error_max_lines: int

    @classmethod
    def of(cls, settings: Settings) -> WindowLimits:
        return cls(settings.window_max_lines, settings.window_max_bytes,
                   settings.first_error_max_lines)


# A worker's limits with the default settings: what training windows are built with
# (inference.preprocess.window_from_text), so the model learns on the windows it is served.
DEFAULT_LIMITS = WindowLimits.of(Settings())


def _size(line: str) -> int:
    # UTF-8 byte length; ASCII (nearly every log line) avoids the encode.
    return len(line) if line.isascii() else len(line.encode())


class TailWindow:
    """What is kept of one job attempt's output. Not thread-safe; owned by one agent."""

    __slots__ = ("limits", "tail", "tail_bytes", "first_error", "fe_state", "line_count",
                 "last_seen", "eos", "last_offset", "saved_lines", "saved_first_chunk")

    def __init__(self, limits: WindowLimits) -> None:
        self.limits = limits
        self.tail: deque[str] = deque()
        self.tail_bytes = 0
        self.first_error: list[str] = []
        self.fe_state = _FE_NONE if limits.first_error_max_lines > 0 else _FE_CLOSED
        self.line_count = 0
        self.last_seen = 0.0
        self.eos = False
        # Offset of the last log record applied. A job's records all live on one partition,
        # so a replay after a crash is recognised and skipped: the window counts each line once.
        self.last_offset = -1
        # What the window store has persisted (line_count then, first chunk kept): the next
        # save writes only what changed since.
        self.saved_lines = 0
        self.saved_first_chunk = 0

    @property
    def tail_start(self) -> int:
        """Index, among all lines the attempt printed, of the first line in the tail."""
        return self.line_count - len(self.tail)

    def extend(self, lines: Iterable[str], now: float) -> None:
        """Append lines in the order printed, evicting the oldest beyond the limits."""
        tail = self.tail
        limits = self.limits
        max_lines, max_bytes = limits.max_lines, limits.max_bytes
        fe_max = limits.first_error_max_lines
        size = self.tail_bytes
        count = 0
        for line in lines:
            count += 1
            n = _size(line)
            if n > max_bytes:  # a single line larger than the window keeps its end
                # cut in bytes, not characters: cut by characters, a line of multi-byte
                # characters stayed over the limit and was then evicted whole
                line = line.encode()[-max_bytes:].decode("utf-8", "ignore")
                n = _size(line)
            tail.append(line)
            size += n
            if self.fe_state != _FE_CLOSED:
                if self.fe_state == _FE_OPEN:
                    self.first_error.append(line)
                    if len(self.first_error) >= fe_max:
                        self.fe_state = _FE_CLOSED
                elif is_error_start(line):
                    self.first_error.append(line)
                    self.fe_state = _FE_OPEN if fe_max > 1 else _FE_CLOSED
            while len(tail) > max_lines or size > max_bytes:
                size -= _size(tail.popleft())
        self.tail_bytes = size
        self.line_count += count
        self.last_seen = now

    def to_log_window(self, job_id: str, attempt: int) -> LogWindow:
        return LogWindow(job_id, attempt, list(self.tail), list(self.first_error),
                         self.line_count)

    @property
    def memory_bytes(self) -> int:
        """Bytes of log text held (the quantity the limits bound)."""
        return self.tail_bytes + sum(map(_size, self.first_error))

    @classmethod
    def restore(cls, limits: WindowLimits, tail: list[str], first_error: list[str],
                fe_state: int, line_count: int, last_seen: float, eos: bool,
                last_offset: int) -> TailWindow:
        """A window rebuilt from persisted parts, under the current limits."""
        window = cls(limits)
        window.fe_state = _FE_CLOSED  # the block is restored as saved, not re-detected
        window.extend(tail, last_seen)
        window.first_error = first_error[: limits.first_error_max_lines]
        if window.first_error or fe_state == _FE_NONE:
            window.fe_state = fe_state
        if len(window.first_error) >= limits.first_error_max_lines:
            window.fe_state = _FE_CLOSED
        window.line_count = line_count
        window.eos = eos
        window.last_offset = last_offset
        return window
