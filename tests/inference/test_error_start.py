"""The cheap literal screen in front of the error-start regex never hides a match, and the
answer remembered per digit shape is the pattern's for every line of that shape."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from sibylla.inference.api import ERROR_START, is_error_start

FRAGMENTS = st.sampled_from([
    "Traceback (most recent call last):", "ValueError:", "RuntimeError", "Exception",
    "KeyboardInterrupt", "SystemExit", "ERROR", "FATAL", "CRITICAL", "Fatal error",
    "Segmentation fault", "Killed", "NCCL WARN", "NCCL ERROR", "ncclUnhandled", "CUDA error",
    "CUDA out of memory", "out of memory", "Xid", "ECC error", "error:", "srun: error",
    "slurmstepd: error", "exited with code 1", "exited with exit code 3",
    "terminate called after throwing", "Watchdog caught collective", "Loss is nan",
    "DUE TO NODE FAILURE", "step 10 loss 0.31", "[rank3]:", " ", ":", "\t",
    "exited with code 0", "exited with code ", "code 0", "Xid 79", "0x1f", "é",
])


@settings(max_examples=500, deadline=None)
@given(st.lists(st.one_of(FRAGMENTS, st.text(max_size=12)), max_size=6).map("".join))
def test_the_screen_agrees_with_the_full_pattern(line: str) -> None:
    assert is_error_start(line) == (ERROR_START.search(line) is not None)


@settings(max_examples=500, deadline=None)
@given(st.lists(st.one_of(FRAGMENTS, st.text(max_size=12)), max_size=6).map("".join),
       st.lists(st.sampled_from("0123456789"), min_size=1, max_size=8))
def test_lines_that_differ_only_in_digits_each_get_the_patterns_answer(
        line: str, digits: list[str]) -> None:
    """The first line fills the per-shape memory; the second, same shape, must not be
    answered wrongly from it ("exited with code 0" does not open a report, "code 1" does)."""
    other = iter(digits * (len(line) + 1))
    variant = "".join(next(other) if c.isdigit() and c.isascii() else c for c in line)
    for text in (line, variant, line):
        assert is_error_start(text) == (ERROR_START.search(text) is not None)
