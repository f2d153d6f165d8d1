"""The template cache and the incremental featuriser give exactly the batch path's input.

The reference is the preprocessing the shipped model was trained with, kept verbatim in
``test_fast_path_equivalence``; lines here are built to stress what the template cache relies
on: digits of every value (``0x`` vs ``6x``), hex-looking words, numbers next to letters, secret
hints with and without a secret, control characters and non-ASCII text.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from sibylla.inference.api import LogWindow
from sibylla.inference.features import encode_window
from sibylla.inference.incremental import IncrementalFeatures
from sibylla.inference.preprocess import (
    SEPARATOR_LINE,
    prepare_line,
    select_lines,
    window_from_text,
)
from sibylla.inference.synthetic import generate
from sibylla.streams.window import TailWindow, WindowLimits
from tests.inference.test_fast_path_equivalence import (
    _assert_same,
    _reference_mask,
    _reference_model_lines,
    _reference_redact,
    _shipped_vocab,
)

_PIECES = st.sampled_from([
    "0x", "6x", "0X1f", "x", "X", "deadbeef", "ab12cd34ef", "rank", "step", " ", "  ", ":", ".",
    ",", "-", "+", "e-", "/", "\\", "://", "http", "token=", "password: ", "Bearer ", "hf_",
    "AKIA", "eyJ", "Error", "NCCL", "[", "]", "(", ")", "'", '"', "\x1c", "\u00e9", "\t",
    "Mon Jan ", "T", "Z", "a", "F", "E", "I", "W", "<num>", "_", "@",
])
_DIGITS = st.text(st.sampled_from("0123456789"), min_size=1, max_size=12)
lines = st.lists(st.one_of(_PIECES, _DIGITS), max_size=24).map("".join)


@settings(max_examples=400, deadline=None)
@given(st.lists(lines, min_size=1, max_size=6))
def test_prepared_lines_match_the_reference(batch: list[str]) -> None:
    for line in batch:
        shown = _reference_redact(line)
        masked = _reference_mask(shown)
        p = prepare_line(line)
        assert p.line.shown == shown.strip()
        assert p.line.masked == masked
        assert bool(p.key) == bool(masked.strip())
    # two lines share a key exactly when they mask to the same text
    for a in batch:
        for b in batch:
            same = _reference_mask(_reference_redact(a)).strip() == \
                _reference_mask(_reference_redact(b)).strip()
            assert (prepare_line(a).key == prepare_line(b).key) == same


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(lines, st.sampled_from(["Traceback (most recent call last):",
                                                  "RuntimeError: 0x12 step 3", ""])),
                max_size=40))
def test_windows_match_the_reference(tail: list[str]) -> None:
    window = LogWindow("j", 0, tail=tail, first_error=tail[:5])
    _assert_same(window, _shipped_vocab())
    want = _reference_model_lines(window)
    first, rest = select_lines(window)
    assert [*first, *rest] == [line for line in want if line is not SEPARATOR_LINE]


def _window_of(lines: list[str], limits: WindowLimits) -> LogWindow:
    window = TailWindow(limits)
    window.extend(lines, 0.0)
    return window.to_log_window("", 0)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(lines, st.sampled_from(["Traceback (most recent call last):",
                                                  "ValueError: bad 12", "Killed", ""])),
                max_size=60),
       st.lists(st.integers(min_value=1, max_value=9), max_size=12),
       st.sampled_from([WindowLimits(256, 64 * 1024, 48), WindowLimits(12, 300, 4),
                        WindowLimits(5, 60, 1), WindowLimits(30, 10_000, 0)]))
def test_incremental_features_equal_the_batch_path(printed: list[str], cuts: list[int],
                                                   limits: WindowLimits) -> None:
    """Fed in arbitrary chunks, under any limits: the same window and the same model input."""
    vocab = _shipped_vocab()
    features = IncrementalFeatures(limits)
    pos = 0
    for cut in [*cuts, len(printed)]:
        features.feed(printed[pos : pos + cut])
        pos += cut
    features.feed(printed[pos:])
    window = _window_of(printed, limits)
    assert features.log_window() == window
    assert features.empty == window.empty
    assert features.encode(vocab) == encode_window(window, vocab)
    _assert_same(window, vocab)


def test_incremental_features_on_generated_logs() -> None:
    vocab = _shipped_vocab()
    records = generate(80, seed=21)
    for i in range(0, len(records), 4):
        text = "\n".join(r.log for r in records[i : i + 4])
        features = IncrementalFeatures()
        for line in text.splitlines():
            features.feed([line])
        assert features.encode(vocab) == encode_window(window_from_text(text), vocab)
