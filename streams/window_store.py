"""Persisting windows incrementally in changelog-backed tables.

Rewriting a whole window (up to ``window_max_bytes``) to the changelog every time a line
arrives makes the changelog many times larger than the input: with one-line records the
benchmark measured ~24 KB written per 90-byte line. So a window is stored as

- its lines in *chunks*, each written once, when it is complete: a chunk is one of the
  window's compressed blocks (``limits.block_lines`` consecutive lines, 32 by default), written
  as the window holds it, so a line is compressed once and the changelog holds about a third of
  the text. The chunks one save completes go together, up to ``SEGMENT_CHUNKS`` at a time, as
  *segments* keyed by their first chunk's number (a LogBatch of 300 benchmark lines into a new
  window: the eight chunks of its 256-line tail in one record of 2.7 KB, where 16-line chunks
  of JSON text went as four records of 15 KB, each of which costs faust's table path and a
  produce), and
- a *header*: counts, flags, the first error block, the lines of the chunk still filling and
  the first chunk number of each segment kept.

A save is then usually one small record (the header), plus the segments of the chunks completed
since the last save, plus deletions of segments whose chunks all fell out of the tail: the
changelog grows with the input, and a compacted changelog holds about one window's worth per
attempt.
"""

from __future__ import annotations

import struct
import sys
from array import array
from collections.abc import Sequence
from typing import Any

import orjson

from sibylla.streams.window import Block, TailWindow, WindowLimits, decompress

__all__ = ["SEGMENT_CHUNKS", "WindowStore"]

# Chunks per segment at most: records of a few KB (~2.7 KB of the benchmark's lines; a default
# window's whole tail). Records of uncompressed text that size (a 200-line LogBatch, ~20 KB)
# raised the peak RSS with 10,000 windows by ~70 MiB: the producer buffer is bounded in records
# (fastpath.PRODUCER_BUFFER_MAX_MESSAGES), so its bytes grow with their size. Against 4: 2.7-2.9
# instead of 3.3-3.4 us of CPU per batched line, 168-170 instead of 147-161 MiB above serving
# with 10,000 windows (docs/pipeline-bench.md, finding 23).
SEGMENT_CHUNKS = 8
_FORMAT = 3  # of the header; bump when its layout changes
# Format 1 (before segments): a record per chunk, none listed in the header. Formats 1 and 2
# stored a chunk's lines as JSON ``[first line number, [lines]]``, format 3 compressed blocks.
_READABLE = (1, 2, _FORMAT)

# A segment of compressed blocks: this byte (a JSON chunk starts with "["), the number of its
# first line and its block count, then per block its line count and compressed size, the
# lines' sizes (uint32, little-endian) and the compressed bytes.
_BLOCKS = b"Z"
_SEGMENT_HEAD = struct.Struct("<QH")
_BLOCK_HEAD = struct.Struct("<HI")


def _le(sizes: array[int]) -> array[int]:
    if sys.byteorder == "little":
        return sizes
    swapped = array(sizes.typecode, sizes)
    swapped.byteswap()
    return swapped


def _encode_segment(first_line: int, blocks: Sequence[Block]) -> bytes:
    parts = [_BLOCKS, _SEGMENT_HEAD.pack(first_line, len(blocks))]
    for data, sizes in blocks:
        parts += (_BLOCK_HEAD.pack(len(sizes), len(data)), _le(sizes).tobytes(), data)
    return b"".join(parts)


def _decode_segment(raw: bytes) -> tuple[int, list[str]]:
    """The number of a segment's first line, and its lines (any format)."""
    if not raw.startswith(_BLOCKS):
        first, listed = orjson.loads(raw)
        return first, listed
    first_line, count = _SEGMENT_HEAD.unpack_from(raw, len(_BLOCKS))
    at = len(_BLOCKS) + _SEGMENT_HEAD.size
    lines: list[str] = []
    for _ in range(count):
        n, size = _BLOCK_HEAD.unpack_from(raw, at)
        at += _BLOCK_HEAD.size
        sizes = array("I")
        sizes.frombytes(raw[at:at + n * sizes.itemsize])
        at += n * sizes.itemsize
        lines += decompress((raw[at:at + size], _le(sizes)))
        at += size
    return first_line, lines


def _chunk_key(key: str, n: int) -> str:
    return f"{key}#b{n}"


def _chunk_key_before_blocks(key: str, n: int) -> str:
    """The key of chunk ``n`` in formats 1 and 2 (chunks of half a block)."""
    return f"{key}#{n}"


class WindowStore:
    """Windows in two tables (``headers``: attempt key -> header, ``chunks``: key#n -> the
    lines of the segment that starts at chunk n).

    The tables are faust tables in a worker and plain dicts in unit tests; writes must happen
    where faust allows them (in an agent, in the event context of the job's partition).
    """

    def __init__(self, headers: Any, chunks: Any, limits: WindowLimits) -> None:
        self.headers = headers
        self.chunks = chunks
        self.limits = limits
        # Chunk keys of windows loaded from an older format, which their next saves rewrite:
        # listed in no header written since, they go once one such header has been written
        # and a commit has followed (the window's next save), or with the window.
        self._replaced: dict[str, list[str]] = {}
        self._droppable: dict[str, list[str]] = {}

    def save(self, key: str, window: TailWindow) -> None:
        """Persist what changed since the window was last saved: the chunks completed since
        (:meth:`save_chunks`), then the header."""
        for stale in self._droppable.pop(key, ()):
            self._drop(stale)
        if key in self._replaced:
            self._droppable[key] = self._replaced.pop(key)
        self.save_chunks(key, window)
        c = self.limits.block_lines
        start, count = window.tail_start, window.line_count
        open_lo = max(count // c * c, start)
        self.headers[key] = orjson.dumps([
            _FORMAT, count, window.tail_len, window.last_seen, window.eos, window.fe_state,
            window.last_offset, window.first_error, open_lo, window.lines(open_lo - start),
            list(window.saved_segments)])

    def save_chunks(self, key: str, window: TailWindow, at_least: int = 0) -> None:
        """Let the window compress its complete chunks, then write those completed since it
        was last saved and drop those that left the tail, once ``at_least`` chunks completed.

        The chunks are written once and are most of a window's bytes: written as they
        complete, a window holds few lines uncompressed whenever its header is saved. A
        header saved later lists them; until then the one on the changelog does not, and a
        restart rebuilds the window from that one and the records after it."""
        c = window.limits.block_lines
        start, count = window.tail_start, window.line_count
        first, filling = start // c, count // c
        new = max(first, window.saved_lines // c)  # the first chunk completed since
        # A window whose log has ended waits only for its termination, and is freed soon
        # after its decision: compressing it saved memory for moments, and was 12 % of the
        # event loop's samples in a py-spy profile of the benchmark's decisions phase
        # (docs/pipeline-bench.md, finding 22). The limits bound it uncompressed too. Its
        # chunks are compressed only to be written (a commit came before its decision).
        if filling - new < at_least:
            if not window.eos:
                window.compact()
            return
        if filling > new or not window.eos:
            window.compact()
        segments = window.saved_segments
        for n in range(new, filling, SEGMENT_CHUNKS):
            first_line, blocks = window.closed_blocks(
                n * c, min(n + SEGMENT_CHUNKS, filling) * c)
            self.chunks[_chunk_key(key, n)] = _encode_segment(first_line, blocks)
            segments.append(n)
        # A segment goes once every chunk of it left the tail (it ends where the next begins;
        # the newest, where the complete chunks end).
        while segments and (segments[1] if len(segments) > 1 else filling) <= first:
            self._drop(_chunk_key(key, segments.pop(0)))
        # Other keys below the tail: a segment a save wrote before a crash whose replay keyed
        # the same lines otherwise.
        for n in range(window.saved_first_chunk, first):
            if n not in segments:
                self._drop(_chunk_key(key, n))
        window.saved_lines, window.saved_first_chunk = count, first

    def load(self, key: str, header: bytes) -> TailWindow:
        """The window of ``key`` that its header (and chunks) describe."""
        fields = orjson.loads(header)
        if fields[0] not in _READABLE:
            raise ValueError(f"window header format {fields[0]} is not one of {_READABLE}")
        (count, tail_len, last_seen, eos, fe_state, last_offset, first_error, open_lo,
         open_lines) = fields[1:10]
        c, chunk_key = self.limits.block_lines, _chunk_key
        if fields[0] < 3:
            c, chunk_key = c // 2, _chunk_key_before_blocks
        start = count - tail_len
        listed = fields[10] if fields[0] >= 2 else range(start // c, count // c)
        tail: list[str] = []
        segments: list[int] = []
        for n in listed:
            raw = self.chunks.get(chunk_key(key, n))
            if not isinstance(raw, bytes):
                continue  # format 1: a chunk never written (evicted before it completed)
            lo, lines = _decode_segment(raw)
            tail.extend(lines[max(0, start - lo):])
            segments.append(n)
        tail.extend(open_lines[max(0, start - open_lo):])
        window = TailWindow.restore(self.limits, tail, first_error, fe_state, count, last_seen,
                                    eos, last_offset)
        if fields[0] < 3:  # its next save writes the tail's chunks again, as blocks
            self._replaced[key] = [chunk_key(key, n) for n in segments]
            window.saved_first_chunk = start // self.limits.block_lines
            return window
        window.saved_lines, window.saved_first_chunk = count, start // c
        window.saved_segments = segments
        return window

    def delete(self, key: str, window: TailWindow | None) -> None:
        """Forget an attempt's window (decided, completed or expired)."""
        if window is not None:
            c = self.limits.block_lines
            for n in set(window.saved_segments).union(
                    range(window.saved_first_chunk, window.saved_lines // c)):
                self._drop(_chunk_key(key, n))
        for stale in self._replaced.pop(key, []) + self._droppable.pop(key, []):
            self._drop(stale)
        self._drop(key, self.headers)

    def _drop(self, key: str, table: Any = None) -> None:
        table = self.chunks if table is None else table
        if key in table:
            del table[key]
