"""The cheap literal screen in front of the error-start regex never hides a match."""

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
])


@settings(max_examples=500, deadline=None)
@given(st.lists(st.one_of(FRAGMENTS, st.text(max_size=12)), max_size=6).map("".join))
def test_the_screen_agrees_with_the_full_pattern(line: str) -> None:
    assert is_error_start(line) == (ERROR_START.search(line) is not None)
