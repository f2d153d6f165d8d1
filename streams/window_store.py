"""Persisting windows incrementally in changelog-backed tables.

Rewriting a whole window (up to ``window_max_bytes``) to the changelog every time a line
arrives makes the changelog many times larger than the input: with one-line records the
benchmark measured ~24 KB written per 90-byte line. So a window is stored as

- its lines in *chunks* of ``CHUNK_LINES`` consecutive lines, each written once, when it is
  complete, keyed by chunk number, and
- a *header*: counts, flags, the first error block and the lines of the chunk still filling.

A save is then usually one small record (the header), plus one record per chunk completed
since the last save, plus deletions of chunks that fell out of the tail: the changelog grows
with the input, and a compacted changelog holds about one window's worth per attempt.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import orjson

from sibylla.streams.window import BLOCK_LINES, TailWindow, WindowLimits

__all__ = ["CHUNK_LINES", "WindowStore"]

# A divisor of the window's compressed blocks, so that a save reads the lines it writes
# uncompressed (window.BLOCK_LINES).
CHUNK_LINES = BLOCK_LINES // 2
_FORMAT = 1  # of the header; bump when its layout changes


def _chunk_key(key: str, n: int) -> str:
    return f"{key}#{n}"


class WindowStore:
    """Windows in two tables (``headers``: attempt key -> header, ``chunks``: key#n -> lines).

    The tables are faust tables in a worker and plain dicts in unit tests; writes must happen
    where faust allows them (in an agent, in the event context of the job's partition).
    """

    def __init__(self, headers: Any, chunks: Any, limits: WindowLimits,
                 chunk_lines: int = CHUNK_LINES) -> None:
        self.headers = headers
        self.chunks = chunks
        self.limits = limits
        self.chunk_lines = chunk_lines

    def save(self, key: str, window: TailWindow) -> None:
        """Persist what changed since the window was last saved, then let the window
        compress it (:meth:`TailWindow.compact`: the lines are read before that)."""
        c = self.chunk_lines
        start, count = window.tail_start, window.line_count
        first, filling = start // c, count // c
        new = max(first, window.saved_lines // c)  # the first chunk completed since
        if new < filling:
            base = max(new * c, start)
            completed = window.lines(base - start, filling * c - start)
            for n in range(new, filling):
                lo = max(n * c, start)
                self.chunks[_chunk_key(key, n)] = orjson.dumps(
                    [lo, completed[lo - base:(n + 1) * c - base]])
        for n in range(window.saved_first_chunk, first):
            self._drop(_chunk_key(key, n))
        open_lo = max(filling * c, start)
        self.headers[key] = orjson.dumps([
            _FORMAT, count, window.tail_len, window.last_seen, window.eos, window.fe_state,
            window.last_offset, window.first_error, open_lo, window.lines(open_lo - start)])
        window.saved_lines, window.saved_first_chunk = count, first
        window.compact()

    def load(self, key: str, header: bytes) -> TailWindow:
        """The window of ``key`` that its header (and chunks) describe."""
        fields = orjson.loads(header)
        if fields[0] != _FORMAT:
            raise ValueError(f"window header format {fields[0]} is not {_FORMAT}")
        (_, count, tail_len, last_seen, eos, fe_state, last_offset, first_error, open_lo,
         open_lines) = fields
        start = count - tail_len
        tail = [line for index, line in self._chunk_lines(key, start, count) if index >= start]
        tail.extend(open_lines[max(0, start - open_lo):])
        window = TailWindow.restore(self.limits, tail, first_error, fe_state, count, last_seen,
                                    eos, last_offset)
        window.saved_lines, window.saved_first_chunk = count, start // self.chunk_lines
        return window

    def _chunk_lines(self, key: str, start: int, count: int) -> Iterator[tuple[int, str]]:
        """(index, line) of the completed chunks that hold tail lines."""
        c = self.chunk_lines
        for n in range(start // c, count // c):
            raw = self.chunks.get(_chunk_key(key, n))
            if not isinstance(raw, bytes):
                continue  # never written: evicted before it completed
            lo, lines = orjson.loads(raw)
            yield from enumerate(lines, lo)

    def delete(self, key: str, window: TailWindow | None) -> None:
        """Forget an attempt's window (decided, completed or expired)."""
        if window is not None:
            c = self.chunk_lines
            for n in range(window.saved_first_chunk, window.saved_lines // c):
                self._drop(_chunk_key(key, n))
        self._drop(key, self.headers)

    def _drop(self, key: str, table: Any = None) -> None:
        table = self.chunks if table is None else table
        if key in table:
            del table[key]
