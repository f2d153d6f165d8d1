"""Turn raw log lines into the redacted, masked lines a model reads; shared by training and
serving.

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

import bisect
import functools
import itertools
import operator
import re
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple, TypeVar

from sibylla.streams.window import DEFAULT_LIMITS, TailWindow, WindowLimits

from .api import DIGITS_AS_ZERO, LogWindow

__all__ = [
    "LINE_BREAK",
    "SEPARATOR",
    "SEPARATOR_LINE",
    "Line",
    "Prepared",
    "mask",
    "prepare_line",
    "select_prepared",
    "select_window",
    "budget_tokens",
    "redact",
    "redact_lines",
    "select_lines",
    "tokenize",
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

# Words a plain (ASCII) line lowered must hold for the secret pattern at the same place to
# match it: a line with a hint (e.g. "tokens=", "passed") runs only the patterns it may match,
# not all eight (~45 µs a line).
_SECRET_GATES = [
    ("pass", "pwd", "secret", "key", "token"),
    ("authoriz",),
    ("bearer",),
    ("hf_", "hf-", "ghp_", "ghp-", "gho_", "gho-", "ghs_", "ghs-", "github_pat", "sk_", "sk-",
     "xox"),
    ("akia",),
    ("eyj",),
    ("://",),
    ("private key",),
]

# Every secret pattern needs one of these words; most lines have none, and one search for them
# is several times cheaper than running each pattern (serving preprocesses every kept line).
_SECRET_HINT = re.compile(r"(?i)pass|pwd|secret|key|token|bearer|authoriz|hf[_-]|gh[pos][_-]"
                          r"|github_pat|sk[_-]|xox[abp]|akia|eyj|://")
# The same search on a lower-cased ASCII line: without IGNORECASE, several times faster, and
# exact there (Unicode case folding only differs from ASCII lower-casing on non-ASCII text).
_SECRET_HINT_LOWER = re.compile(_SECRET_HINT.pattern.removeprefix("(?i)"))


def _has_unicode_only_space(text: str) -> bool:
    r"""Whether ``text`` holds one of the four ASCII control characters that Unicode ``\s``
    matches and ASCII-mode patterns do not (``\x1c``-``\x1f``)."""
    # Four substring searches: ~1 us on a window's 19 KB of joined text, where a regex
    # character class took ~130 us (a tenth of redacting the window for its label).
    return "\x1c" in text or "\x1d" in text or "\x1e" in text or "\x1f" in text


def _ascii_mode(pattern: re.Pattern[str]) -> re.Pattern[str]:
    """``pattern`` in ASCII mode: faster, and the same matches on :func:`_plain_ascii` text."""
    return re.compile(pattern.pattern, (pattern.flags & ~re.UNICODE) | re.ASCII)


def _plain_ascii(line: str) -> bool:
    r"""Whether ASCII-mode patterns match ``line`` exactly as the Unicode ones do.

    On ASCII text ``\d``, ``\w``, ``\b`` and IGNORECASE agree between the two modes; only
    ``\s`` differs, on ``\x1c``-``\x1f``.
    """
    return line.isascii() and not _has_unicode_only_space(line)


def _redact(line: str, plain: bool) -> str:
    if plain:
        lower = line.lower()
        if not _SECRET_HINT_LOWER.search(lower):
            return line
        # A gate holds in the line as found; what a pattern replaces becomes "<secret>", which
        # opens no later pattern's gate.
        for pattern, gate in zip(_SECRETS_ASCII, _SECRET_GATES, strict=True):
            if any(word in lower for word in gate):
                line = pattern.sub(_keep_prefix, line)
        return line
    if not _SECRET_HINT.search(line):
        return line
    for pattern in _SECRETS:  # Unicode case folding: a lowered line is no sure gate
        line = pattern.sub(_keep_prefix, line)
    return line


def _keep_prefix(m: re.Match[str]) -> str:
    return m.group(1) + "<secret>"


def redact(line: str) -> str:
    """``line`` with every credential-looking value replaced by ``<secret>``."""
    return _redact(line, _plain_ascii(line))


def redact_lines(lines: Sequence[str]) -> list[str]:
    """``[redact(line) for line in lines]``, in one scan of their joined text.

    A window's lines are mostly without a hint of a secret; a search per line cost ~5 µs of
    Python each (a decision's log for the votes table: ~1 ms of 212 lines). The hints hold no
    line break, so a hint found in the joined text lies in one line, and only those lines are
    redacted one by one."""
    text = "\n".join(lines)
    if not _plain_ascii(text):  # some line is not: the per-line path decides per line
        return [redact(line) for line in lines]
    out = list(lines)
    found = _SECRET_HINT_LOWER.finditer(text.lower())
    hit = next(found, None)
    if hit is None:
        return out
    ends = list(itertools.accumulate(len(line) + 1 for line in lines))  # past each "\n"
    for i in {bisect.bisect_right(ends, m.start()) for m in itertools.chain((hit,), found)}:
        out[i] = _redact(lines[i], True)
    return out


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


# ---------------------------------------------------------------- the per-line fast path
#
# Every mask pattern treats the ten ASCII digits alike (``\d``, ``[0-9a-f]``, ``\w``, ``\b``)
# except the literal ``0x`` of hex numbers: two plain ASCII lines that differ only in their digit
# values, and not in which digits before an ``x`` are zeros, are masked at the same spans, and
# their masked forms differ only in the digits that survive masking (``rank3`` keeps its 3).
# A line's *template* (every digit ``0``, but ``1`` for a nonzero one before ``x`` or ``X``)
# is therefore masked once and cached, with
# the positions of its surviving digits; a line costs a translate, a dict lookup and the few
# surviving digits. Tokens drop digits, so the template's tokens are the line's tokens too.
# Lines that are not plain ASCII, or hold a secret, take the general path.

_ZERO_DIGITS = str.maketrans("123456789", "000000000")
_NONZERO_BEFORE_X = re.compile(r"[1-9](?=[xX])")


def _line_template(line: str, raw: bytes) -> bytes:
    """ASCII ``line`` (``raw``: it encoded, digits translated by ``DIGITS_AS_ZERO``, holding
    ``0x`` or ``0X``) with every digit ``0``, except a nonzero digit before ``x``/``X``: ``1``."""
    chars = bytearray(raw)
    for m in _NONZERO_BEFORE_X.finditer(line):
        chars[m.start()] = 49  # "1"
    return bytes(chars)


_TEMPLATE_SERIALS = itertools.count(1)  # 0 stands for the separator line (features.py)


class _Template:
    """A plain ASCII, secret-free line's masking, shared by every line of the same digit shape.

    ``masked``: the masked template; ``key``: it stripped (empty: a blank line); ``src``/``dst``:
    per surviving digit, its index in the raw line and in ``masked``; ``tokens``: filled on
    first use (only kept lines are tokenized); ``ids``: per vocabulary, the tokens' ids;
    ``features``: what the model reads of the line, whatever the vocabulary; ``serial``: this
    template object's number, never reused in the process (a loaded model keys its per-line
    vectors by it: :mod:`.line_vectors`).
    """

    __slots__ = ("general", "masked", "key", "src", "dst", "pick", "tokens", "ids", "features",
                 "serial")

    def __init__(self, raw_template: bytes) -> None:
        template = raw_template.decode("ascii")
        # Lines of this template take the general path when they hold a control character on
        # which Unicode ``\s`` differs, or a secret. Neither depends on digit values: the
        # secret patterns, like the masks, treat digits alike and hold no digit, so redaction
        # changes a line exactly when it changes the line's template.
        self.general = (_has_unicode_only_space(template)
                        or _redact(template, True) != template)
        masked, origin = ("", []) if self.general else _mask_tracked(template)
        self.masked = masked
        self.key = masked.strip().translate(_ZERO_DIGITS)
        dst = [j for j, c in enumerate(masked) if c in "01" and origin[j] >= 0]
        self.dst = tuple(dst)
        self.src = tuple(origin[j] for j in dst)
        # the surviving digits of a line of this template, as _digits_value gives them
        self.pick = operator.itemgetter(*self.src) if self.src else None
        self.tokens: list[str] | None = None
        self.ids: dict[int, Any] = {}  # the model's padded id row per vocabulary (features.py)
        self.features: object | None = None  # the model's per-line features (features.py)
        self.serial = next(_TEMPLATE_SERIALS)


def _mask_tracked(line: str) -> tuple[str, list[int]]:
    """``_mask(line, plain=True)`` and, per output character, its index in ``line`` (-1 for a
    placeholder's): the same patterns, screens and order, each substitution done by hand."""
    has_digit = _DIGIT.search(line) is not None
    origin = list(range(len(line)))
    for pattern, placeholder, may_match in _MASKS_ASCII:
        if not may_match(line, has_digit):
            continue
        pieces: list[str] = []
        new_origin: list[int] = []
        pos = 0
        for m in pattern.finditer(line):
            start, end = m.span()
            pieces += (line[pos:start], placeholder)
            new_origin += origin[pos:start]
            new_origin += [-1] * len(placeholder)
            pos = end
        if pieces:
            pieces.append(line[pos:])
            new_origin += origin[pos:]
            line, origin = "".join(pieces), new_origin
    return line, origin


# A template with its tokens and ids holds about 2.4 KB (measured with tracemalloc on the
# pipeline benchmark's windows, whose 1,024 jobs print 67 templates): 16,384 of them bound
# the cache near 40 MB.
@functools.lru_cache(maxsize=1 << 14)
def _template(template: bytes) -> _Template:
    return _Template(template)


Key = str | tuple[str, str | tuple[str, ...]]


def _digits_key(masked: str) -> Key:
    """A key equal for two masked lines exactly when their stripped texts are equal: the text
    with every digit ``0``, and its digits (only when there are any): one digit as itself,
    several as a tuple, as ``operator.itemgetter`` picks them from a line."""
    stripped = masked.strip()
    digits = [c for c in stripped if "0" <= c <= "9"]
    shape = stripped.translate(_ZERO_DIGITS)
    if not digits:
        return shape
    return shape, digits[0] if len(digits) == 1 else tuple(digits)


class Prepared:
    """One raw line prepared for selection: ``key`` (empty for a blank line; equal for lines
    that mask to the same text) and, built only for the lines kept, its :class:`Line`."""

    __slots__ = ("key", "raw", "template", "_line")

    def __init__(self, key: Key, raw: str, template: _Template | None,
                 line: Line | None) -> None:
        self.key = key
        self.raw = raw
        self.template = template
        self._line = line

    @property
    def line(self) -> Line:
        if self._line is None:
            tpl = self.template
            assert tpl is not None
            masked = tpl.masked
            if tpl.dst:
                chars = list(masked)
                raw = self.raw
                for j, i in zip(tpl.dst, tpl.src, strict=True):
                    chars[j] = raw[i]
                masked = "".join(chars)
            self._line = Line(self.raw.strip(), masked)
        return self._line

    def tokens(self) -> list[str]:
        """``tokenize(line.masked)`` plus ``<nl>`` (cached per template)."""
        tpl = self.template
        if tpl is None:
            return tokenize(self.line.masked) + [LINE_BREAK]
        if tpl.tokens is None:
            tpl.tokens = tokenize(tpl.masked) + [LINE_BREAK]
        return tpl.tokens


def prepare_line(line: str) -> Prepared:
    """``line`` redacted and masked (see :class:`Prepared`); cheap for a line whose template
    was seen before."""
    if line.isascii():
        raw = line.encode("ascii").translate(DIGITS_AS_ZERO)
        if b"0x" in raw or b"0X" in raw:
            raw = _line_template(line, raw)
        tpl = _template(raw)
        if not tpl.general:
            if tpl.pick is not None:
                return Prepared((tpl.key, tpl.pick(line)), line, tpl, None)
            return Prepared(tpl.key, line, tpl, None)
    plain = _plain_ascii(line)
    shown = _redact(line, plain)
    masked = _mask(shown, plain)
    return Prepared(_digits_key(masked), line, None, Line(shown.strip(), masked))


def select_prepared(first_error: Iterable[Prepared], tail: Iterable[Prepared],
                    max_tail: int = 48) -> tuple[list[Prepared], list[Prepared]]:
    """(first error block, tail) with blanks and repeats dropped (ranks print the same error),
    keeping the first copy of each; of the tail only its last ``max_tail`` distinct lines."""
    seen: set[Key] = set()
    first = []
    for p in first_error:
        if p.key and p.key not in seen:
            seen.add(p.key)
            first.append(p)
    kept = []
    for p in tail:
        if p.key and p.key not in seen:
            seen.add(p.key)
            kept.append(p)
    return first, kept[-max_tail:]


def _prepare_all(lines: Iterable[str], done: dict[str, Prepared]) -> list[Prepared]:
    out = []
    for line in lines:
        prepared = done.get(line)
        if prepared is None:
            prepared = done[line] = prepare_line(line)
        out.append(prepared)
    return out


def select_window(window: LogWindow, max_tail: int = 48
                  ) -> tuple[list[Prepared], list[Prepared]]:
    """:func:`select_prepared` of ``window``'s lines (a line printed twice is prepared once)."""
    done: dict[str, Prepared] = {}
    return select_prepared(_prepare_all(window.first_error, done),
                           _prepare_all(window.tail, done), max_tail)


def select_lines(window: LogWindow, max_tail: int = 48) -> tuple[list[Line], list[Line]]:
    """(first error block, tail) of ``window``, redacted and masked, repeats collapsed.

    Only the last ``max_tail`` distinct tail lines are kept: the tail's job is to show how the
    process died, and the lines before are mostly progress noise.
    """
    first, tail = select_window(window, max_tail)
    return [p.line for p in first], [p.line for p in tail]


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


T = TypeVar("T")


def budget_tokens(per_line: Sequence[Sequence[T]], sep: int, max_tokens: int
                  ) -> tuple[list[T], list[int]]:
    """Per-line token lists, the separator's at index ``sep``, cut to ``max_tokens``: (flat
    list, line index of each entry). The first error block is kept from its start and the tail
    from its end: when the budget runs out, the middle goes, because the root cause sits at
    the start of the block and the death at the end of the tail."""
    total = sum(len(toks) for toks in per_line)
    keep: range | set[int] = range(len(per_line))
    if total > max_tokens:
        head_budget = max_tokens // 2
        used = 0
        n_head = 0
        for i in range(sep):
            if used + len(per_line[i]) > head_budget:
                break
            n_head += 1
            used += len(per_line[i])
        kept = set(range(n_head))
        for i in range(len(per_line) - 1, n_head - 1, -1):
            if used + len(per_line[i]) > max_tokens:
                break
            kept.add(i)
            used += len(per_line[i])
        keep = kept
    tokens: list[T] = []
    owners: list[int] = []
    for i in sorted(keep) if isinstance(keep, set) else keep:
        toks = per_line[i]
        tokens.extend(toks)
        owners.extend([i] * len(toks))
    return tokens[:max_tokens], owners[:max_tokens]
