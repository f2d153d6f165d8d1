"""The bounded per-attempt log window: the tail plus the first error block.

A job can print gigabytes; Sibylla keeps only what the classifier needs, so a window's memory
never exceeds its limits however much the job prints:

- the *tail*: the last ``max_lines`` lines and at most ``max_bytes`` bytes of them;
- the *first error block*: up to ``first_error_max_lines`` lines starting at the first line
  that opens an error report. The root cause is often printed long before a distributed job
  dies, and the tail then fills with teardown noise from the other ranks.

A worker holds a window per running attempt (10,000 of 200 lines in the pipeline benchmark), so
the tail is kept compact: the newest lines as strings, older ones in zstd-compressed blocks of
:data:`BLOCK_LINES` lines with each line's size beside them (eviction needs sizes, not text).
As one Python string each, 10,000 windows of the benchmark's lines held ~260 MiB; compressed,
about a third of that. zstd at level 1 takes ~0.9 us of CPU per line and shrinks a block of
the benchmark's lines 3.8 times, where zlib at level 1 took ~2.3 us (8 % of the worker's busy
time on one-line records) for 3.3 times; it also decompresses twice as fast. Lines are
compressed by :meth:`TailWindow.compact` when the window store saves the window, and the store
writes those compressed blocks to the changelog as they are (:meth:`TailWindow.closed_blocks`):
a line is compressed once, and the changelog holds a third of its text.

Persisting windows (incrementally, in chunks) is :mod:`sibylla.streams.window_store`'s job.
"""

from __future__ import annotations

import threading
from array import array
from collections.abc import Sequence
from dataclasses import dataclass

import zstandard

from sibylla.inference.api import LogWindow, is_error_start
from sibylla.settings import Settings

__all__ = ["BLOCK_LINES", "DEFAULT_LIMITS", "Block", "TailWindow", "WindowLimits", "decompress"]

# Lines per compressed block of a tail, by default (ratio ~3.8 on training logs). Blocks end
# where the attempt's line number is a multiple of it: the window store's chunks are blocks.
BLOCK_LINES = 32

# States of the first error block.
_FE_NONE, _FE_OPEN, _FE_CLOSED = 0, 1, 2


@dataclass(frozen=True, slots=True)
class WindowLimits:
    """A window's bounds, and the lines per compressed block of its tail (the unit the window
    store persists; small in tests, so that small windows have many)."""

    max_lines: int
    max_bytes: int
    first_error_max_lines: int
    block_lines: int = BLOCK_LINES

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


def _within(line: str, max_bytes: int) -> str:
    """``line``, or its end when it is larger than a whole window: cut in bytes, not
    characters (cut by characters, a line of multi-byte characters stayed over the limit and
    was then evicted whole)."""
    if _size(line) <= max_bytes:
        return line
    return line.encode()[-max_bytes:].decode("utf-8", "ignore")


# A compressed block: the lines' UTF-8 bytes back to back, compressed, and each line's size.
Block = tuple[bytes, "array[int]"]


class _Codec(threading.local):
    """The calling thread's zstd contexts. A context is reused for every block (a new one per
    block costs a third more CPU) and must never be used by two threads at once."""

    def __init__(self) -> None:
        self.compressor = zstandard.ZstdCompressor(level=1)
        self.decompressor = zstandard.ZstdDecompressor()


_CODEC = _Codec()


def _compress(lines: list[str]) -> Block:
    """The block of ``lines``."""
    encoded = [line.encode() for line in lines]
    # Copied: python-zstandard's result keeps the allocation of the worst case it was written
    # into (3.9 times the compressed size here), which made a window larger than its text.
    data = bytes(memoryview(_CODEC.compressor.compress(b"".join(encoded))))
    return data, array("I", map(len, encoded))


def decompress(block: Block, skip: int = 0) -> list[str]:
    """The lines of a block, less its first ``skip``."""
    data = _CODEC.decompressor.decompress(block[0])
    out, at = [], 0
    for i, size in enumerate(block[1]):
        if i >= skip:
            out.append(data[at:at + size].decode())
        at += size
    return out


class TailWindow:
    """What is kept of one job attempt's output. Not thread-safe; owned by one agent.

    The tail is ``_blocks`` (compressed, oldest first; the first ``_skip`` lines of the oldest
    already evicted) followed by ``_open`` (the newest lines: fewer than :data:`BLOCK_LINES`
    after :meth:`compact`, whatever arrived since before it; the limits bound them either way).
    """

    __slots__ = ("limits", "_blocks", "_skip", "_open", "tail_len", "tail_bytes", "first_error",
                 "fe_state", "line_count", "last_seen", "eos", "last_offset", "saved_lines",
                 "saved_first_chunk", "saved_segments")

    def __init__(self, limits: WindowLimits) -> None:
        self.limits = limits
        # A list, not a deque: an empty deque costs 760 bytes per window, and a tail holds at
        # most max_lines / BLOCK_LINES + 1 blocks, so dropping the oldest is cheap either way.
        self._blocks: list[Block] = []
        self._skip = 0
        self._open: list[str] = []
        self.tail_len = 0
        self.tail_bytes = 0
        self.first_error: list[str] = []
        self.fe_state = _FE_NONE if limits.first_error_max_lines > 0 else _FE_CLOSED
        self.line_count = 0
        self.last_seen = 0.0
        self.eos = False
        # Offset of the last log record applied. A job's records all live on one partition,
        # so a replay after a crash is recognised and skipped: the window counts each line once.
        self.last_offset = -1
        # What the window store has persisted (line_count then, first chunk kept, the first
        # chunk of each segment it keeps): the next save writes only what changed.
        self.saved_lines = 0
        self.saved_first_chunk = 0
        self.saved_segments: list[int] = []  # a deque costs 760 bytes per window empty

    @property
    def tail_start(self) -> int:
        """Index, among all lines the attempt printed, of the first line in the tail."""
        return self.line_count - self.tail_len

    @property
    def tail(self) -> list[str]:
        """The tail's lines, oldest first (decompressed: a copy)."""
        return self.lines(0)

    def lines(self, lo: int, hi: int | None = None) -> list[str]:
        """Tail lines ``lo`` to ``hi`` (positions in the tail, oldest 0), decompressing only
        the blocks that hold them."""
        hi = self.tail_len if hi is None else min(hi, self.tail_len)
        out: list[str] = []
        at = 0  # tail position of the current block's first kept line
        for i, block in enumerate(self._blocks):
            skip = self._skip if i == 0 else 0
            n = len(block[1]) - skip
            if at + n > lo and at < hi:
                kept = decompress(block, skip)
                out.extend(kept[max(0, lo - at):hi - at])
            at += n
            if at >= hi:
                return out
        return out + self._open[max(0, lo - at):hi - at]

    def extend(self, lines: Sequence[str], now: float) -> None:
        """Append lines in the order printed, evicting the oldest beyond the limits.

        The lines are taken together: appended, screened for the first error block, and
        then the oldest beyond the limits evicted at once. The tail is the one a line at a
        time would keep, the longest suffix within the limits (a line evicted while later
        ones came in would not fit beside all of them either), and a LogBatch's hundreds of
        lines cost a few passes in C rather than a loop step each in Python (the agents
        hand a window all its lines of a batch at once, one-line records too)."""
        if not lines:
            self.last_seen = now
            return
        max_bytes = self.limits.max_bytes
        if all(map(str.isascii, lines)) and max(map(len, lines)) <= max_bytes:
            added = sum(map(len, lines))  # ASCII: a character is a byte
        else:
            lines = [_within(line, max_bytes) for line in lines]
            added = sum(map(_size, lines))
        self._open.extend(lines)
        if self.fe_state != _FE_CLOSED:
            self._note_first_error(lines)
        self.tail_bytes += added
        self.tail_len += len(lines)
        self.line_count += len(lines)
        self.last_seen = now
        if self.tail_len > self.limits.max_lines or self.tail_bytes > max_bytes:
            self._evict()

    def _note_first_error(self, lines: Sequence[str]) -> None:
        """Add to the first error block what ``lines`` hold of it: from the first line that
        opens an error report while none has, until the block is full."""
        fe_max, block = self.limits.first_error_max_lines, self.first_error
        at = 0
        if self.fe_state == _FE_NONE:
            for at, line in enumerate(lines):  # noqa: B007 - at: where the block opens
                if is_error_start(line):
                    break
            else:
                return
            self.fe_state = _FE_OPEN
        block.extend(lines[at:at + fe_max - len(block)])
        if len(block) >= fe_max:
            self.fe_state = _FE_CLOSED

    def _evict(self) -> None:
        """Drop the oldest lines of the tail until it is within the limits: whole blocks, or
        a block's first lines, by count (their sizes summed in C), then one line at a time
        while the bytes are still over."""
        max_lines, max_bytes = self.limits.max_lines, self.limits.max_bytes
        blocks, open_ = self._blocks, self._open
        size, length, skip = self.tail_bytes, self.tail_len, self._skip
        while blocks and (length > max_lines or size > max_bytes):
            sizes = blocks[0][1]
            drop = min(max(length - max_lines, 0), len(sizes) - skip)
            size -= sum(sizes[skip:skip + drop])
            length -= drop
            skip += drop
            while size > max_bytes and skip < len(sizes):
                size -= sizes[skip]
                length -= 1
                skip += 1
            if skip == len(sizes):
                del blocks[0]
                skip = 0
        drop = max(length - max_lines, 0)
        size -= sum(map(_size, open_[:drop]))
        while size > max_bytes:  # each line is within max_bytes: one at least stays
            size -= _size(open_[drop])
            drop += 1
        del open_[:drop]
        self.tail_bytes, self.tail_len, self._skip = size, length - drop, skip

    def compact(self) -> None:
        """Compress the open lines up to the last multiple of ``limits.block_lines`` among the
        attempt's line numbers into blocks ending at such multiples."""
        open_, c = self._open, self.limits.block_lines
        done = len(open_) - self.line_count % c
        if done <= 0:
            return
        at = 0
        # The first block may be short: its first lines were evicted before it closed.
        for end in range(done % c or c, done + 1, c):
            self._blocks.append(_compress(open_[at:end]))
            at = end
        del open_[:done]

    def closed_blocks(self, lo: int, hi: int) -> tuple[int, list[Block]]:
        """The compressed blocks that end after line ``lo`` and by line ``hi`` (line numbers
        among all the attempt printed, multiples of ``limits.block_lines``, ``hi`` at most
        where the closed blocks end: call after :meth:`compact`), and the number of the first
        line they hold. That line may precede the tail (the oldest block keeps the lines
        evicted since it closed) and may follow ``lo`` (lines evicted before it closed)."""
        c, blocks = self.limits.block_lines, self._blocks
        end = self.line_count - len(self._open)  # where the newest block ends
        first = max(0, len(blocks) - (end - lo) // c)
        last = len(blocks) - (end - hi) // c
        chosen = blocks[first:last]
        if not chosen:
            return hi, []
        ends_at = end - (len(blocks) - last) * c
        return ends_at - (len(chosen) - 1) * c - len(chosen[0][1]), chosen

    def to_log_window(self, job_id: str, attempt: int) -> LogWindow:
        return LogWindow(job_id, attempt, self.tail, list(self.first_error),
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
        window.line_count = line_count - len(tail)  # blocks end at the same line numbers
        window.extend(tail, last_seen)
        window.compact()
        window.first_error = first_error[: limits.first_error_max_lines]
        if window.first_error or fe_state == _FE_NONE:
            window.fe_state = fe_state
        if len(window.first_error) >= limits.first_error_max_lines:
            window.fe_state = _FE_CLOSED
        window.line_count = line_count
        window.eos = eos
        window.last_offset = last_offset
        return window
