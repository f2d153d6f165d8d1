"""The per-attempt window keeps what the classifier needs and never more than its limits."""

from __future__ import annotations

import random
import tracemalloc

from hypothesis import given, settings
from hypothesis import strategies as st

from sibylla.streams.window import TailWindow, WindowLimits

LINES = st.lists(st.text(max_size=120).map(lambda s: s.replace("\n", " ")), max_size=300)
LIMITS = st.builds(WindowLimits, max_lines=st.integers(1, 50),
                   max_bytes=st.integers(256, 4096), first_error_max_lines=st.integers(0, 10))


def _utf8(lines: list[str]) -> int:
    return sum(len(line.encode()) for line in lines)


@settings(max_examples=200, deadline=None)
@given(limits=LIMITS, chunks=st.lists(LINES, max_size=5))
def test_window_stays_within_its_limits_and_keeps_the_latest_lines(limits, chunks) -> None:
    window = TailWindow(limits)
    printed: list[str] = []
    for chunk in chunks:
        window.extend(chunk, now=1.0)
        printed.extend(chunk)
    tail = list(window.tail)
    assert len(tail) <= limits.max_lines
    assert _utf8(tail) <= limits.max_bytes
    assert window.tail_bytes == _utf8(tail)
    assert window.line_count == len(printed)
    assert len(window.first_error) <= limits.first_error_max_lines
    # The tail is the end of what was printed (lines longer than the window keep their end).
    if tail:
        assert printed[-1].endswith(tail[-1])
        assert all(printed[len(printed) - len(tail) + i].endswith(line)
                   for i, line in enumerate(tail))


ERRORISH = st.sampled_from(["Traceback (most recent call last):", "RuntimeError: CUDA error",
                            "NCCL WARN Connection closed", "é" * 90, "x" * 300, ""])


@settings(max_examples=300, deadline=None)
@given(limits=st.builds(WindowLimits, max_lines=st.integers(1, 40),
                        max_bytes=st.integers(64, 2048),
                        first_error_max_lines=st.integers(0, 6),
                        block_lines=st.sampled_from([2, 4, 8])),
       chunks=st.lists(st.lists(st.one_of(LINES.map(lambda ls: ls[0] if ls else "a"),
                                          ERRORISH), max_size=40), max_size=6),
       compact_after=st.lists(st.booleans(), min_size=6, max_size=6))
def test_lines_taken_together_leave_the_window_lines_taken_one_by_one_leave(
        limits, chunks, compact_after) -> None:
    """The stream hands a window all its lines of a batch at once: the tail, the first error
    block and the counts must be those of the same lines appended one at a time."""
    together, one_by_one = TailWindow(limits), TailWindow(limits)
    printed: list[str] = []
    for chunk, compact in zip(chunks, compact_after, strict=False):
        together.extend(chunk, now=2.0)
        printed.extend(chunk)
        for line in chunk:
            one_by_one.extend([line], now=2.0)
        if compact:  # older lines in compressed blocks, evicted from them next time
            together.compact()
            one_by_one.compact()
        assert together.tail == one_by_one.tail
        assert together.first_error == one_by_one.first_error
        assert (together.line_count, together.tail_len, together.tail_bytes) == (
            one_by_one.line_count, one_by_one.tail_len, one_by_one.tail_bytes)
        assert together.tail_bytes == _utf8(together.tail)
        assert together.tail == _longest_suffix_within(printed, limits)


def _longest_suffix_within(printed: list[str], limits: WindowLimits) -> list[str]:
    """What a tail must hold: the most recent lines (each larger than the window cut to its
    last ``max_bytes`` bytes) that fit the limits together."""
    kept: list[str] = []
    size = 0
    for line in reversed(printed):
        if len(line.encode()) > limits.max_bytes:
            line = line.encode()[-limits.max_bytes:].decode("utf-8", "ignore")
        if len(kept) == limits.max_lines or size + len(line.encode()) > limits.max_bytes:
            break
        kept.append(line)
        size += len(line.encode())
    return kept[::-1]


def test_the_first_error_block_survives_teardown_noise() -> None:
    limits = WindowLimits(max_lines=5, max_bytes=10_000, first_error_max_lines=3)
    window = TailWindow(limits)
    window.extend(["step 1 loss 0.3", "step 2 loss 0.2"], now=1.0)
    window.extend(["Traceback (most recent call last):", '  File "train.py", line 9',
                   "FileNotFoundError: /data/imagenet/train.lst"], now=2.0)
    window.extend([f"[rank{r}] NCCL WARN socket closed" for r in range(40)], now=3.0)
    assert window.first_error == ["Traceback (most recent call last):",
                                  '  File "train.py", line 9',
                                  "FileNotFoundError: /data/imagenet/train.lst"]
    assert len(window.tail) == 5
    assert window.tail[-1] == "[rank39] NCCL WARN socket closed"
    assert window.to_log_window("j", 0).line_count == 45


def test_a_job_printing_without_end_costs_no_more_than_its_window() -> None:
    limits = WindowLimits(max_lines=100, max_bytes=8192, first_error_max_lines=10)
    window = TailWindow(limits)
    for step in range(20_000):
        window.extend([f"step {step} loss {1 / (step + 1):.6f} " + "x" * 80], now=float(step))
    assert window.memory_bytes <= limits.max_bytes
    assert window.line_count == 20_000


@settings(max_examples=200, deadline=None)
@given(line=st.text(min_size=1, max_size=400).map(lambda s: s.replace("\n", " ")),
       max_bytes=st.integers(4, 200))
def test_a_line_longer_than_the_window_keeps_its_end_whatever_its_characters(
        line: str, max_bytes: int) -> None:
    # The error is at a long line's end; cut by characters, a line of multi-byte characters
    # stayed over the byte limit and the window dropped it whole.
    window = TailWindow(WindowLimits(max_lines=5, max_bytes=max_bytes, first_error_max_lines=1))
    window.extend([line], now=0.0)
    kept = list(window.tail)
    assert window.tail_bytes <= max_bytes
    if len(line.encode()) <= max_bytes:
        assert kept == [line]
    else:
        assert len(kept) == 1 and line.endswith(kept[0])
        assert len(kept[0].encode()) > max_bytes - 4  # at most one character's bytes lost


@settings(max_examples=200, deadline=None)
@given(limits=LIMITS, chunks=st.lists(LINES, max_size=5), lo=st.integers(0, 60),
       width=st.integers(0, 60), compactions=st.lists(st.booleans(), min_size=5, max_size=5))
def test_any_stretch_of_the_tail_reads_back_as_kept(limits, chunks, lo, width,
                                                   compactions) -> None:
    # The window store persists stretches of the tail; saved lines are then compressed.
    window = TailWindow(limits)
    reference = TailWindow(limits)  # never compacted
    for chunk, compact in zip(chunks, compactions, strict=False):
        window.extend(chunk, now=1.0)
        reference.extend(chunk, now=1.0)
        if compact:
            window.compact()
    tail = window.tail
    assert tail == reference.tail
    assert len(tail) == window.tail_len
    assert window.lines(lo, lo + width) == tail[lo:lo + width]
    if tail:  # the newest line, from the open lines or the newest compressed block
        assert window.lines(window.tail_len - 1) == [tail[-1]]


def test_a_window_holds_its_text_in_a_fraction_of_the_texts_size() -> None:
    # 10,000 running jobs' windows must fit a worker's memory: older lines are compressed.
    rng = random.Random(7)

    def line(step: int) -> str:
        return (f"[rank{rng.randrange(8)}]: step {step} | loss {rng.random():.4f} | lr 3.000e-04"
                f" | grad_norm {rng.random() * 2:.3f} | {rng.uniform(90, 160):.1f} samples/s")

    limits = WindowLimits(max_lines=200, max_bytes=1 << 20, first_error_max_lines=10)
    tracemalloc.start()
    windows = []
    for _ in range(200):
        window = TailWindow(limits)
        for step in range(0, 400, 20):  # as records arrive: 20 lines at a time, each
            window.extend([line(s) for s in range(step, step + 20)], now=1.0)
            window.compact()  # batch saved by the window store, which then compacts
        windows.append(window)
    held, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    text = sum(w.tail_bytes for w in windows)
    assert all(w.tail_len == 200 for w in windows)
    assert held < 0.6 * text, (held, text)
