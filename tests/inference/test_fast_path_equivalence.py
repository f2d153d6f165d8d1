"""The fast preprocessing gives the model exactly what the plain, line-by-line one gives.

``_reference_*`` below is the original preprocessing, verbatim (before the per-window cache of
prepared lines, the per-template masking, the ASCII-mode patterns, the substring prefilters and
the cached CamelCase split). Any difference fails here: in the lines read, their token ids or
their wide n-gram counts (which the fast path computes once per line template), in the token
view of the word TF-IDF, on the real corpus, on generated logs or on adversarial lines.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sibylla.inference.api import LogWindow
from sibylla.inference.checkpoint import load_checkpoint
from sibylla.inference.corpus import REAL_FILES, load_records, packaged_path
from sibylla.inference.features import (
    FIRST_LINES,
    MAX_LINE_TOKENS,
    MAX_LINES,
    MAX_TOKENS,
    encode_window,
    window_tokens,
)
from sibylla.inference.preprocess import (
    SEPARATOR_LINE,
    Line,
    budget_tokens,
    mask,
    redact,
    tokenize,
    window_from_text,
)
from sibylla.inference.synthetic import augment, generate
from sibylla.inference.vocab import Vocabulary
from sibylla.inference.wide import line_grams

_SECRET_HINT = re.compile(r"(?i)pass|pwd|secret|key|token|bearer|authoriz|hf[_-]|gh[pos][_-]"
                          r"|github_pat|sk[_-]|xox[abp]|akia|eyj|://")
_SECRETS = [
    # key=value style credentials: password=..., api_key: ..., token="..."
    re.compile(
        r"(?i)\b([\w-]*(?:password|passwd|pwd|secret|api[_-]?key|access[_-]?key|token)"
        r"['\"]?\s*[=:]\s*['\"]?)(?!<secret>)[^\s'\",;]+"
    ),
    re.compile(r"(?i)\b(authorization:\s*(?:bearer|basic|token)\s+)\S+"),
    re.compile(r"(?i)\b(bearer\s+)[A-Za-z0-9._~+/=-]{8,}"),
    # well-known token shapes: Hugging Face, GitHub, OpenAI-style, Slack, AWS access keys, JWTs
    re.compile(r"()\b(?:hf|ghp|gho|ghs|github_pat|sk|xox[abp])[_-][A-Za-z0-9_-]{16,}"),
    re.compile(r"()\bAKIA[0-9A-Z]{16}\b"),
    re.compile(r"()\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"),
    # credentials inside URLs: scheme://user:password@host
    re.compile(r"(\w+://[^\s:/@]+:)[^\s@/]+(?=@)"),
    re.compile(r"()-----BEGIN [A-Z ]*PRIVATE KEY-----.*?(?:-----END [A-Z ]*PRIVATE KEY-----|$)"),
]

_MASKS: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"\b[a-z][a-z0-9+.-]*://\S+", re.I), " <url> "),
    (re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b", re.I),
     " <uuid> "),
    (re.compile(
        r"\b\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(?::\d{2}(?:[.,]\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?"
        r"|\b[EWIF]\d{4} \d{2}:\d{2}:\d{2}(?:\.\d+)?"
        r"|\b\d{1,2}:\d{2}:\d{2}(?:\.\d+)?\b"
        r"|\b(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) (?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)"
        r" +\d{1,2}\b"
    ), " <ts> "),
    (re.compile(r"\b(?:\d{1,3}\.){3}\d{1,3}(?::\d+)?\b|\[?\b[0-9a-f]{1,4}(?::[0-9a-f]{0,4}){4,7}\]?",
                re.I), " <ip> "),
    # Windows and POSIX paths: keep the basename, it often names the failing module.
    (re.compile(r"(?<![\w<>?.])(?:[A-Za-z]:|~|\.{1,3})?(?:[\\/][^\s\\/:\"'`(),;<>\[\]{}|“”]+)+"
                r"[\\/]"), " <path>/"),
    (re.compile(r"\b0x[0-9a-f]+\b|\b(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{8,}\b", re.I),
     " <hex> "),
    (re.compile(r"(?<![A-Za-z_\d])[-+]?\d+(?:[.,]\d+)*(?:e[-+]?\d+)?"), " <num> "),
]
_DIGIT = re.compile(r"\d")
_NEEDS_DIGIT = {2, 5, 6}
_CAMEL = re.compile(r"(?<=[a-z])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")
_TOKEN = re.compile(r"<[a-z]+>|[A-Za-z]+|[^\sA-Za-z0-9_]")


def _reference_redact(line: str) -> str:
    if not _SECRET_HINT.search(line):
        return line
    for pattern in _SECRETS:
        line = pattern.sub(lambda m: m.group(1) + "<secret>", line)
    return line


def _reference_mask(line: str) -> str:
    has_digit = _DIGIT.search(line) is not None
    for i, (pattern, placeholder) in enumerate(_MASKS):
        if has_digit or i not in _NEEDS_DIGIT:
            line = pattern.sub(placeholder, line)
    return line


def _reference_prepare(lines: Iterable[str], skip: set[str]) -> list[Line]:
    out = []
    for line in lines:
        shown = _reference_redact(line)
        masked = _reference_mask(shown)
        key = masked.strip()
        if key and key not in skip:
            skip.add(key)
            out.append(Line(shown.strip(), masked))
    return out


def _reference_model_lines(window: LogWindow, max_tail: int = 48) -> list[Line]:
    seen: set[str] = set()
    first = _reference_prepare(window.first_error, seen)
    tail = _reference_prepare(window.tail, seen)[-max_tail:]
    return [*first, SEPARATOR_LINE, *tail]


def _reference_tokenize(line: str, max_tokens: int = 64) -> list[str]:
    out: list[str] = []
    for tok in _TOKEN.findall(line):
        if tok.startswith("<") and tok.endswith(">") and len(tok) > 2:
            out.append(tok)
        elif tok[0].isalpha():
            out.extend(part.lower() for part in _CAMEL.split(tok) if part)
        else:
            out.append(tok)
        if len(out) >= max_tokens:
            return out[:max_tokens]
    return out


def _reference_tokens(window: LogWindow) -> tuple[list[str], list[int], list[Line]]:
    lines = _reference_model_lines(window)
    per_line = [["<sep>"] if line is SEPARATOR_LINE else _reference_tokenize(line.masked)
                + ["<nl>"] for line in lines]
    tokens, owners = budget_tokens(per_line, lines.index(SEPARATOR_LINE), MAX_TOKENS)
    return tokens, owners, lines


def _reference_encoded(window: LogWindow, vocab: Vocabulary
                       ) -> tuple[list[Line], list[list[int]], list[list[list[int]]]]:
    """(lines read, their ids, the wide counts of every selected line) of the model."""
    lines = _reference_model_lines(window)
    sep = lines.index(SEPARATOR_LINE)
    first, tail = lines[:sep], lines[sep + 1 :]
    head = first[:FIRST_LINES]
    read = [*head, SEPARATOR_LINE, *tail[max(0, len(tail) - (MAX_LINES - 1 - len(head))):]]
    ids = [vocab.encode(["<sep>"] if line is SEPARATOR_LINE else
                        _reference_tokenize(line.masked)[:MAX_LINE_TOKENS]) for line in read]
    return read, ids, [line_grams(line.masked).tolist() for line in (*first, *tail)]


@functools.cache
def _shipped_vocab() -> Vocabulary:
    """The shipped model's vocabulary, loaded once when a test first needs it."""
    return load_checkpoint().vocab


@pytest.fixture(scope="module")
def vocab() -> Vocabulary:
    return _shipped_vocab()


def _assert_same(window: LogWindow, vocab: Vocabulary) -> None:
    enc = encode_window(window, vocab)
    lines, ids, wide = _reference_encoded(window, vocab)
    assert enc.lines == lines
    assert [[i for i in row if i] for row in enc.ids.tolist()] == ids
    assert [w.tolist() for w in enc.wide] == wide
    assert window_tokens(window) == _reference_tokens(window)


def _corpus_texts() -> list[str]:
    return [r.log for name in REAL_FILES for r in load_records(packaged_path(name))]


def test_real_corpus_gives_the_same_features(vocab: Vocabulary) -> None:
    texts = _corpus_texts()
    assert len(texts) >= 131  # files a and d, and every real file added since
    for i, text in enumerate(texts):
        _assert_same(window_from_text(text, job_id=str(i)), vocab)
        # and every line on its own, through the public functions
        for line in text.splitlines():
            shown = redact(line)
            assert shown == _reference_redact(line)
            assert mask(shown) == _reference_mask(shown)
            assert tokenize(mask(shown)) == _reference_tokenize(_reference_mask(shown))


def test_generated_logs_give_the_same_features(vocab: Vocabulary) -> None:
    records = generate(400, seed=11)
    for r in records:
        _assert_same(window_from_text(r.log, job_id=r.id), vocab)
    # Long windows like the benchmark's: eight logs end to end, the budget overflows.
    for i in range(0, len(records), 8):
        log = "\n".join(r.log for r in records[i : i + 8])
        _assert_same(window_from_text(log, job_id=str(i)), vocab)


def test_augmented_and_odd_text_gives_the_same_features(vocab: Vocabulary) -> None:
    import random

    rng = random.Random(5)
    odd = ["caf\u00e9 0xDEADbeef at /h\u00f6me/u/x.py:12", "PA\u017fSWORD=hunter2hunter2",
           "\u212aEY=abc 10.0.0.1:80", "a\x1cb /x/y/ 12:30:00 \x1f\x1e",
           "x /ab\x1ccd/ef/ http://h\x1d/p token=a\x1eb", "\x85/p/q/ 1.5e-3",
           "fe80::1:2:3:4 https://user:pw@host/x", "\u0130 token: abc", "",
           "   ", "ModuleNotFoundError: No module named 'ĀbcDef'"]
    for line in odd:
        assert redact(line) == _reference_redact(line)
        assert mask(line) == _reference_mask(line), line
        _assert_same(LogWindow("j", 0, tail=[line, "x"], first_error=[line]), vocab)
    for text in _corpus_texts()[:40]:
        noisy = augment(text, rng)
        lines = noisy.splitlines()
        for k in range(0, len(lines), 7):
            lines.insert(k, rng.choice(odd))
        _assert_same(window_from_text("\n".join(lines)), vocab)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.text(st.characters(blacklist_categories=("Cs",)), max_size=120),
                max_size=30))
def test_arbitrary_lines_give_the_same_features(lines: list[str]) -> None:
    vocab = _shipped_vocab()
    window = LogWindow("j", 0, tail=lines, first_error=lines[:5])
    _assert_same(window, vocab)
    for line in lines:
        assert redact(line) == _reference_redact(line)
        assert mask(line) == _reference_mask(line)
        assert tokenize(line) == _reference_tokenize(line)
