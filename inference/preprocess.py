"""Turn raw log lines into the token sequence a model reads; shared by training and serving.

Three steps, each a pure function so that the property tests can pin them down:

1. :func:`redact` removes secrets (tokens, keys, passwords) before a line is stored, logged or
   shown as evidence.
2. :func:`mask` replaces what varies between jobs and tells nothing about the cause (numbers,
   hex, paths, IPs, timestamps, UUIDs, URLs) by placeholders, so that a model learns
   ``CUDA out of memory. Tried to allocate <num> GiB`` once instead of memorising sizes, hosts
   and user names: this is what lets it generalise to clusters it has never seen.
3. :func:`select_lines` keeps the lines that matter: the first error block (the root cause,
   often printed long before the job dies) and the tail (how it died), with repeats from
   interleaved ranks collapsed; :func:`tokenize` splits them into words.

A corpus record holds one text, while the stream hands over a :class:`LogWindow`;
:func:`window_from_text` rebuilds the window the stream would have kept, so a model is trained
on exactly what it sees in production.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable, Sequence
from typing import NamedTuple

from sibylla.streams.window import DEFAULT_LIMITS, TailWindow, WindowLimits

from .api import LogWindow

__all__ = [
    "LINE_BREAK",
    "SEPARATOR",
    "SEPARATOR_LINE",
    "Line",
    "mask",
    "model_lines",
    "redact",
    "select_lines",
    "tokenize",
    "tokens_of_lines",
    "window_from_text",
]

# Placeholder tokens; they survive tokenization as single words.
SEPARATOR = "<sep>"  # between the first error block and the tail
LINE_BREAK = "<nl>"  # end of one line: lets the recurrent encoder see line structure

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


# Every secret pattern needs one of these words; most lines have none, and one search for them
# is several times cheaper than running each pattern (serving preprocesses every kept line).
_SECRET_HINT = re.compile(r"(?i)pass|pwd|secret|key|token|bearer|authoriz|hf[_-]|gh[pos][_-]"
                          r"|github_pat|sk[_-]|xox[abp]|akia|eyj|://")
# The same search on a lower-cased ASCII line: without IGNORECASE, several times faster, and
# exact there (Unicode case folding only differs from ASCII lower-casing on non-ASCII text).
_SECRET_HINT_LOWER = re.compile(_SECRET_HINT.pattern.removeprefix("(?i)"))

# Unicode ``\s`` also matches these four ASCII control characters; ASCII-mode patterns do not.
_UNICODE_ONLY_SPACE = re.compile(r"[\x1c-\x1f]")


def _ascii_mode(pattern: re.Pattern[str]) -> re.Pattern[str]:
    """``pattern`` in ASCII mode: faster, and the same matches on :func:`_plain_ascii` text."""
    return re.compile(pattern.pattern, (pattern.flags & ~re.UNICODE) | re.ASCII)


def _plain_ascii(line: str) -> bool:
    r"""Whether ASCII-mode patterns match ``line`` exactly as the Unicode ones do.

    On ASCII text ``\d``, ``\w``, ``\b`` and IGNORECASE agree between the two modes; only
    ``\s`` differs, on ``\x1c``-``\x1f``.
    """
    return line.isascii() and _UNICODE_ONLY_SPACE.search(line) is None


def _redact(line: str, plain: bool) -> str:
    if plain:
        if not _SECRET_HINT_LOWER.search(line.lower()):
            return line
        patterns = _SECRETS_ASCII
    else:
        if not _SECRET_HINT.search(line):
            return line
        patterns = _SECRETS
    for pattern in patterns:
        line = pattern.sub(lambda m: m.group(1) + "<secret>", line)
    return line


def redact(line: str) -> str:
    """``line`` with every credential-looking value replaced by ``<secret>``."""
    return _redact(line, _plain_ascii(line))


# A cheap test, before a mask's regex scans a line, that a character the mask needs is there
# (most lines skip most scans). ``has_digit`` is of the unmasked line: placeholders add no digit,
# so it stays an upper bound.
Screen = Callable[[str, bool], bool]


def _needs_digit(line: str, has_digit: bool) -> bool:
    return has_digit


# Order matters: the most specific shapes first, so a UUID is not masked as hex and numbers,
# a timestamp not as numbers, a URL not as a path.
_MASKS: list[tuple[re.Pattern[str], str, Screen]] = [
    (re.compile(r"\b[a-z][a-z0-9+.-]*://\S+", re.I), " <url> ", lambda line, _: "://" in line),
    (re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b", re.I),
     " <uuid> ", lambda line, _: "-" in line),
    (re.compile(
        r"\b\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(?::\d{2}(?:[.,]\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?"
        r"|\b[EWIF]\d{4} \d{2}:\d{2}:\d{2}(?:\.\d+)?"
        r"|\b\d{1,2}:\d{2}:\d{2}(?:\.\d+)?\b"
        r"|\b(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) (?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)"
        r" +\d{1,2}\b"
    ), " <ts> ", _needs_digit),
    (re.compile(r"\b(?:\d{1,3}\.){3}\d{1,3}(?::\d+)?\b|\[?\b[0-9a-f]{1,4}(?::[0-9a-f]{0,4}){4,7}\]?",
                re.I), " <ip> ",
     lambda line, has_digit: ":" in line or (has_digit and "." in line)),  # IPv6, IPv4
    # Windows and POSIX paths: keep the basename, it often names the failing module.
    (re.compile(r"(?<![\w<>?.])(?:[A-Za-z]:|~|\.{1,3})?(?:[\\/][^\s\\/:\"'`(),;<>\[\]{}|“”]+)+"
                r"[\\/]"), " <path>/", lambda line, _: "/" in line or "\\" in line),
    (re.compile(r"\b0x[0-9a-f]+\b|\b(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{8,}\b", re.I),
     " <hex> ", _needs_digit),
    (re.compile(r"(?<![A-Za-z_\d])[-+]?\d+(?:[.,]\d+)*(?:e[-+]?\d+)?"), " <num> ",
     _needs_digit),
]


_SECRETS_ASCII = [_ascii_mode(pattern) for pattern in _SECRETS]
_MASKS_ASCII = [(_ascii_mode(pattern), placeholder, screen)
                for pattern, placeholder, screen in _MASKS]

_DIGIT = re.compile(r"\d")


def _mask(line: str, plain: bool) -> str:
    has_digit = _DIGIT.search(line) is not None
    for pattern, placeholder, may_match in _MASKS_ASCII if plain else _MASKS:
        if may_match(line, has_digit):
            line = pattern.sub(placeholder, line)
    return line


def mask(line: str) -> str:
    """``line`` with job-specific values replaced by placeholders (see module docstring)."""
    return _mask(line, _plain_ascii(line))


def window_from_text(text: str, job_id: str = "", limits: WindowLimits | None = None
                     ) -> LogWindow:
    """The window the stream agent would have kept of a job that printed ``text``: built by
    the stream's own :class:`TailWindow`, with the worker's default limits unless ``limits``
    are given, so training and serving see the same windows."""
    window = TailWindow(limits or DEFAULT_LIMITS)
    window.extend(text.splitlines(), 0.0)
    return window.to_log_window(job_id, 0)


class Line(NamedTuple):
    """One selected line: as shown to people (secrets redacted) and as the model reads it."""

    shown: str
    masked: str


SEPARATOR_LINE = Line("", SEPARATOR)


def _prepare(lines: Iterable[str], skip: set[str], done: dict[str, Line]) -> list[Line]:
    """Redacted and masked lines, dropping blanks and repeats (ranks print the same error).

    ``done`` remembers each raw line already prepared: a line printed again (by another rank,
    or in both the error block and the tail) is redacted and masked once.
    """
    out = []
    for line in lines:
        prepared = done.get(line)
        if prepared is None:
            plain = _plain_ascii(line)
            shown = _redact(line, plain)
            prepared = done[line] = Line(shown.strip(), _mask(shown, plain))
        key = prepared.masked.strip()
        if key and key not in skip:
            skip.add(key)
            out.append(prepared)
    return out


def select_lines(window: LogWindow, max_tail: int = 48) -> tuple[list[Line], list[Line]]:
    """(first error block, tail) of ``window``, redacted and masked, repeats collapsed.

    Only the last ``max_tail`` distinct tail lines are kept: the tail's job is to show how the
    process died, and the lines before are mostly progress noise.
    """
    seen: set[str] = set()
    done: dict[str, Line] = {}
    first = _prepare(window.first_error, seen, done)
    tail = _prepare(window.tail, seen, done)[-max_tail:]
    return first, tail


_CAMEL = re.compile(r"(?<=[a-z])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")
_TOKEN = re.compile(r"<[a-z]+>|[A-Za-z]+|[^\sA-Za-z0-9_]")


@functools.lru_cache(maxsize=1 << 16)
def _word_parts(word: str) -> tuple[str, ...]:
    """Lower-cased CamelCase parts of one alphabetic word (log vocabularies repeat: cached)."""
    return tuple(part.lower() for part in _CAMEL.split(word) if part)


def tokenize(line: str, max_tokens: int = 64) -> list[str]:
    """Lower-case words of a masked line, CamelCase split, punctuation kept as tokens.

    Splitting ``ModuleNotFoundError`` into ``module not found error`` lets the model recognise
    exception classes it never saw (``HfHubHTTPError``) from their parts.
    """
    out: list[str] = []
    for tok in _TOKEN.findall(line):
        if tok[0].isalpha():  # placeholders start with "<" and stay whole, like punctuation
            out.extend(_word_parts(tok))
        else:
            out.append(tok)
        if len(out) >= max_tokens:
            return out[:max_tokens]
    return out


def model_lines(window: LogWindow, max_tail: int = 48) -> list[Line]:
    """The lines the model reads, in order, with a separator between error block and tail."""
    first, tail = select_lines(window, max_tail)
    return [*first, SEPARATOR_LINE, *tail]


def tokens_of_lines(lines: Sequence[Line], max_tokens: int, max_line_tokens: int = 64
                    ) -> tuple[list[str], list[int]]:
    """Tokens of ``lines`` (``<nl>`` after each) and, per token, the index of its line.

    The first error block is kept from its start and the tail from its end: when the budget
    of ``max_tokens`` runs out, the middle goes, because the root cause sits at the start of
    the block and the death at the end of the tail.
    """
    per_line = [
        ([SEPARATOR] if line is SEPARATOR_LINE
         else tokenize(line.masked, max_line_tokens) + [LINE_BREAK])
        for line in lines
    ]
    total = sum(len(toks) for toks in per_line)
    if total > max_tokens:
        head_budget = max_tokens // 2
        used = 0
        sep = next((i for i, line in enumerate(lines) if line is SEPARATOR_LINE), len(lines))
        head_idx = []
        for i in range(sep):
            if used + len(per_line[i]) > head_budget:
                break
            head_idx.append(i)
            used += len(per_line[i])
        tail_idx = []
        for i in range(len(lines) - 1, len(head_idx) - 1, -1):
            if used + len(per_line[i]) > max_tokens:
                break
            tail_idx.append(i)
            used += len(per_line[i])
        keep = set(head_idx) | set(tail_idx)
        per_line = [toks if i in keep else [] for i, toks in enumerate(per_line)]
    tokens: list[str] = []
    owners: list[int] = []
    for i, toks in enumerate(per_line):
        tokens.extend(toks)
        owners.extend([i] * len(toks))
    return tokens[:max_tokens], owners[:max_tokens]

