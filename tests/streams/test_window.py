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
    if tail:
        assert window.last_line == tail[-1]


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
