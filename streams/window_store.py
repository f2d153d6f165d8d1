"""Persisting windows incrementally in changelog-backed tables.

Rewriting a whole window (up to ``window_max_bytes``) to the changelog every time a line
arrives makes the changelog many times larger than the input: with one-line records the
benchmark measured ~24 KB written per 90-byte line. So a window is stored as

- its lines in *chunks* of ``CHUNK_LINES`` consecutive lines, each written once, when it is
  complete; the chunks one save completes go together, up to ``SEGMENT_CHUNKS`` at a time, as
  *segments* keyed by their first chunk's number (a LogBatch record of 200 lines completes a
  dozen chunks: three changelog records instead of a dozen, each of which cost faust's table
  path and a produce), and
- a *header*: counts, flags, the first error block, the lines of the chunk still filling and
  the first chunk number of each segment kept.

A save is then usually one small record (the header), plus the segments of the chunks completed
since the last save, plus deletions of segments whose chunks all fell out of the tail: the
changelog grows with the input, and a compacted changelog holds about one window's worth per
attempt.
"""

from __future__ import annotations

from typing import Any

import orjson

from sibylla.streams.window import BLOCK_LINES, TailWindow, WindowLimits

__all__ = ["CHUNK_LINES", "SEGMENT_CHUNKS", "WindowStore"]

# A divisor of the window's compressed blocks, so that a save reads the lines it writes
# uncompressed (window.BLOCK_LINES).
CHUNK_LINES = BLOCK_LINES // 2
# Chunks per segment at most: records of a few KB. A whole 200-line LogBatch in one record
# (~20 KB) raised the peak RSS with 10,000 windows by ~70 MiB: the producer buffer is bounded
# in records (fastpath.PRODUCER_BUFFER_MAX_MESSAGES), so its bytes grow with their size.
SEGMENT_CHUNKS = 4
_FORMAT = 2  # of the header; bump when its layout changes
# Format 1 (before segments): a record per chunk, none listed in the header.
_READABLE = (1, _FORMAT)


def _chunk_key(key: str, n: int) -> str:
    return f"{key}#{n}"


class WindowStore:
    """Windows in two tables (``headers``: attempt key -> header, ``chunks``: key#n -> the
    lines of the segment that starts at chunk n).

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
        """Persist what changed since the window was last saved: the chunks completed since
        (:meth:`save_chunks`), then the header."""
        self.save_chunks(key, window)
        c = self.chunk_lines
        start, count = window.tail_start, window.line_count
        open_lo = max(count // c * c, start)
        self.headers[key] = orjson.dumps([
            _FORMAT, count, window.tail_len, window.last_seen, window.eos, window.fe_state,
            window.last_offset, window.first_error, open_lo, window.lines(open_lo - start),
            list(window.saved_segments)])

    def save_chunks(self, key: str, window: TailWindow, at_least: int = 0) -> None:
        """Write the chunks completed since the window was last saved and drop those that
        left the tail, once ``at_least`` chunks completed, then let the window compress them
        (:meth:`TailWindow.compact`: the lines are read before that).

        The chunks are written once and are most of a window's bytes: written as they
        complete, a window holds few lines uncompressed whenever its header is saved. A
        header saved later lists them; until then the one on the changelog does not, and a
        restart rebuilds the window from that one and the records after it."""
        c = self.chunk_lines
        start, count = window.tail_start, window.line_count
        first, filling = start // c, count // c
        new = max(first, window.saved_lines // c)  # the first chunk completed since
        if filling - new < at_least:
            return
        segments = window.saved_segments
        for n in range(new, filling, SEGMENT_CHUNKS):
            lo, hi = max(n * c, start), min(n + SEGMENT_CHUNKS, filling) * c
            self.chunks[_chunk_key(key, n)] = orjson.dumps(
                [lo, window.lines(lo - start, hi - start)])
            segments.append(n)
        # A segment goes once every chunk of it left the tail (it ends where the next begins;
        # the newest, where the complete chunks end).
        while segments and (segments[1] if len(segments) > 1 else filling) <= first:
            self._drop(_chunk_key(key, segments.pop(0)))
        # Other keys below the tail: chunks of a window saved by format 1, or a segment a save
        # wrote before a crash whose replay keyed the same lines otherwise.
        for n in range(window.saved_first_chunk, first):
            if n not in segments:
                self._drop(_chunk_key(key, n))
        window.saved_lines, window.saved_first_chunk = count, first
        # A window whose log has ended waits only for its termination, and is freed soon
        # after its decision: compressing it saved memory for moments, and was 12 % of the
        # event loop's samples in a py-spy profile of the benchmark's decisions phase
        # (docs/pipeline-bench.md, finding 22). The limits bound it uncompressed too.
        if not window.eos:
            window.compact()

    def load(self, key: str, header: bytes) -> TailWindow:
        """The window of ``key`` that its header (and chunks) describe."""
        fields = orjson.loads(header)
        if fields[0] not in _READABLE:
            raise ValueError(f"window header format {fields[0]} is not one of {_READABLE}")
        (count, tail_len, last_seen, eos, fe_state, last_offset, first_error, open_lo,
         open_lines) = fields[1:10]
        c = self.chunk_lines
        start = count - tail_len
        listed = fields[10] if fields[0] >= 2 else range(start // c, count // c)
        tail: list[str] = []
        segments: list[int] = []
        for n in listed:
            raw = self.chunks.get(_chunk_key(key, n))
            if not isinstance(raw, bytes):
                continue  # format 1: a chunk never written (evicted before it completed)
            lo, lines = orjson.loads(raw)
            tail.extend(lines[max(0, start - lo):])
            segments.append(n)
        tail.extend(open_lines[max(0, start - open_lo):])
        window = TailWindow.restore(self.limits, tail, first_error, fe_state, count, last_seen,
                                    eos, last_offset)
        window.saved_lines, window.saved_first_chunk = count, start // c
        window.saved_segments = segments
        return window

    def delete(self, key: str, window: TailWindow | None) -> None:
        """Forget an attempt's window (decided, completed or expired)."""
        if window is not None:
            c = self.chunk_lines
            for n in set(window.saved_segments).union(
                    range(window.saved_first_chunk, window.saved_lines // c)):
                self._drop(_chunk_key(key, n))
        self._drop(key, self.headers)

    def _drop(self, key: str, table: Any = None) -> None:
        table = self.chunks if table is None else table
        if key in table:
            del table[key]
