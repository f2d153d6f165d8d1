"""Masking, redaction, line selection and tokenization: what the model may and may not see."""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from sibylla.inference.api import LogWindow, is_error_start
from sibylla.inference.features import window_tokens
from sibylla.inference.preprocess import (
    SEPARATOR_LINE,
    mask,
    redact,
    redact_lines,
    tokenize,
    window_from_text,
)
from sibylla.streams.window import WindowLimits

text_lines = st.lists(st.text(st.characters(blacklist_categories=("Cs",)), max_size=120),
                      max_size=40)
secrets = st.from_regex(r"[A-Za-z0-9]{20,40}", fullmatch=True)


@given(st.text(max_size=200), st.integers(min_value=0, max_value=10**12))
def test_numbers_never_reach_the_model(prefix: str, number: int) -> None:
    masked = mask(f"{prefix} allocate {number} bytes")
    assert not re.search(rf"(?<![\w.]){number}(?![\w.])", masked)
    assert "<num>" in masked


@given(st.text(max_size=200))
def test_masking_is_idempotent(line: str) -> None:
    once = mask(line)
    assert mask(once).split() == once.split()


@given(secrets, st.sampled_from(["HF_TOKEN={}", "password: {}", "api_key='{}'",
                                  "Authorization: Bearer {}", "https://bob:{}@example.org/x",
                                  "hf_{}", "ghp_{}", "secret={}"]))
def test_secrets_are_redacted(secret: str, template: str) -> None:
    line = template.format(secret)
    assert secret not in redact(line)
    assert secret not in mask(redact(line))


_SECRET_PIECES = st.sampled_from([
    "token=", "password: ", "Bearer ", "hf_", "ghp_", "AKIA", "eyJ", "https://u:", "@h/",
    "KEY", "api_key='", "step 3 loss 0.1", " ", "\n", "\x1c", "\u00e9", "ab12CD34ef56GH78ij90",
    "'", ",", "x"])
secret_lines = st.lists(st.lists(_SECRET_PIECES, max_size=10).map("".join), max_size=12)


@given(secret_lines)
def test_a_window_is_redacted_as_its_lines_are_one_by_one(lines: list[str]) -> None:
    # The votes table stores the log text redacted in one scan of the window (redact_lines);
    # no secret may survive that the line-by-line redaction removes.
    assert redact_lines(lines) == [redact(line) for line in lines]


def test_job_specific_values_become_placeholders() -> None:
    line = ("2024-03-01T12:00:00Z host 10.1.2.3:29500 wrote /home/alice/runs/exp7/ckpt.pt "
            "uuid 123e4567-e89b-12d3-a456-426614174000 at 0x7fdf8ad37772")
    masked = mask(line)
    for placeholder in ("<ts>", "<ip>", "<path>/ckpt.pt", "<uuid>", "<hex>"):
        assert placeholder in masked
    assert "alice" not in masked and "10.1.2.3" not in masked


def test_tokenize_splits_exception_names_into_words() -> None:
    assert tokenize(mask("HfHubHTTPError: 504")) == ["hf", "hub", "http", "error", ":", "<num>"]
    assert tokenize(mask("ModuleNotFoundError: No module named 'x'"))[:4] == [
        "module", "not", "found", "error"]


@given(text_lines)
def test_window_keeps_tail_and_the_first_error_block(lines: list[str]) -> None:
    lines = [line.replace("\n", " ").replace("\r", " ") for line in lines]
    window = window_from_text("\n".join(lines),
                              limits=WindowLimits(max_lines=10, max_bytes=1 << 20,
                                                  first_error_max_lines=5))
    if window.first_error:
        assert window.first_error[0] in "\n".join(lines)
    assert len(window.tail) <= 10 and len(window.first_error) <= 5
    kept = "\n".join(lines).splitlines()
    assert window.tail == kept[-10:]
    start = next((i for i, line in enumerate(kept) if is_error_start(line)), None)
    assert window.first_error == ([] if start is None else kept[start : start + 5])


def test_root_cause_is_kept_when_the_tail_is_teardown_noise() -> None:
    log = "\n".join(["step 1 loss 2.0"] * 3 + ["Traceback (most recent call last):",
                    "ValueError: bad"] + [f"rank {i} closing" for i in range(300)])
    first, *_ = window_tokens(window_from_text(log))[2]
    assert "Traceback" in first.shown
    tokens, _, _ = window_tokens(window_from_text(log))
    assert "value" in tokens and "bad" in tokens


@settings(max_examples=50)
@given(text_lines, st.integers(min_value=1, max_value=300))
def test_token_budget_is_respected(lines: list[str], budget: int) -> None:
    window = LogWindow("j", 0, tail=lines, first_error=lines[:5])
    tokens, owners, _ = window_tokens(window, budget)
    assert len(tokens) == len(owners) <= budget
    assert owners == sorted(owners)


def test_repeated_rank_lines_are_collapsed() -> None:
    window = LogWindow("j", 0, tail=["[E] Watchdog caught collective operation timeout"] * 50)
    lines = window_tokens(window)[2]
    assert [line for line in lines if line is not SEPARATOR_LINE] == lines[1:]
    assert len(lines) == 2
