"""What one failed attempt tells about the job's history: its root cause, how far it got, and
which nodes the evidence blames.

The policy with memory (``streams/memory.py``) compares these facts across a job's attempts: a
root that recurs without progress will recur again, a job that gets further each time is worth
another try, and a node named by GPU fault lines should not get the job back. Extracted from the
window the worker already keeps (tail + first error block), with plain regular expressions so
an operator can read why an attempt was fingerprinted the way it was.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

from sibylla.inference.api import LogWindow, is_error_start
from sibylla.inference.preprocess import mask

if TYPE_CHECKING:
    from sibylla.streams.reading import WindowReading

__all__ = ["AttemptFacts", "blamed_nodes", "cause_line", "facts_of", "fingerprint",
           "hardware_lines", "progress_of", "template"]

# Lines that follow a failure elsewhere rather than cause it: a rank's watchdog timing out
# because another rank died, the C++ runtime aborting on an exception already printed, a
# launcher reporting a child's exit. They are the root only when nothing else was printed.
_CASCADE = re.compile(
    r"Watchdog caught collective|ProcessGroupNCCL|Timeout at NCCL work|terminate called after"
    r"|DistBackendError|ChildFailedError|exited with (?:exit )?code|srun: error|slurmstepd: error"
    r"|Traceback \(most recent call last\)|^\s*(?:\[rank\d+\]:)?\s*File \""
)
# Rank tags ("[rank3]:") and host tags ("gpu07:", "[node-12]:": a name with a digit, so that
# an exception's class, "RuntimeError:", stays in the template).
_PREFIX = re.compile(r"^\s*(?:\[rank\d+\]:\s*)+|^\s*\[?[A-Za-z][\w.-]*\d[\w.-]*\]?:\s+(?=\S)")

# Progress: training loops print epochs, steps or iterations, and checkpoint saves. Matched in
# the window's text lowered once, and without a leading ``\b``: a case-insensitive pattern, or
# one that opens with an assertion, loses the regex engine's literal-prefix search and cost a
# decision ~5 ms on 200 lines (a third of the worker's time at 100 failures/s). The word start
# is asserted after the literal instead, looking back past it (:func:`_at_word_start`), so
# ``findall`` returns only the numbers that count (a Python check of each match was a quarter
# of the scan). ``[^\S\n]``: whitespace that stays within a line. Steps are three patterns,
# not one alternation, for the same reason: alternatives opening with different letters have
# no common prefix to search for (0.29 ms against 0.16 ms for the three, on a window of 212
# training-log lines).
_NUMBER_AFTER = r"(?:[^\S\n]|[:=\[#])*(\d+)"


def _at_word_start(literal: str, rest: str = "") -> re.Pattern[str]:
    r"""``\b{literal}{rest}`` followed by a number (group 1), with ``literal`` first."""
    return re.compile(literal + rf"(?<!\w{literal})" + rest + _NUMBER_AFTER)


_EPOCH = _at_word_start("epoch")
_STEPS = (_at_word_start("global", "[_ ]step"), _at_word_start("step"),
          _at_word_start("it", "(?:er(?:ation)?)?"))
_TQDM = re.compile(r"\|[^\S\n]*(\d+)/\d+[^\S\n]*\[")  # tqdm: "410/1000 ["
_CHECKPOINT = re.compile(r"\b(?:saved?|saving|wrote|writing)\b.{0,40}\bcheckpoint"
                         r"|\bcheckpoint\b.{0,40}\b(?:saved|written)\b")

# Hardware faults that name the broken machine (or GPU) in the line; a window without any of
# the lowered keywords (nearly all) is not scanned line by line.
_HARDWARE_WORDS = (r"\bXid\b", r"\bECC\b", "uncorrectable", "GPU has fallen off the bus",
                   "NODE FAILURE", "unhealthy GPU", "row remap")
_HARDWARE = re.compile("|".join(_HARDWARE_WORDS), re.I)
_HARDWARE_KEYS = tuple(word.replace(r"\b", "").lower() for word in _HARDWARE_WORDS)
_HOST_TOKEN = re.compile(r"[A-Za-z][\w.-]*")


@dataclass(frozen=True, slots=True)
class AttemptFacts:
    """One attempt of a job as the policy with memory remembers it (bounded size: no log)."""

    attempt: int
    fingerprint: str = ""
    category: str = ""
    progress: tuple[int, int, int] = (0, 0, 0)  # (epoch, step, checkpoints saved)
    nodes: tuple[str, ...] = ()
    blamed: tuple[str, ...] = ()
    charged: bool = True  # counted against the job's retry budget
    action: str = ""
    rule: str = ""

    def to_dict(self) -> dict[str, Any]:
        # By field name, not asdict(), which deep-copies every value: a job's history is
        # written with every decision.
        out = {name: getattr(self, name) for name in _FACT_FIELDS}
        for name in ("progress", "nodes", "blamed"):
            out[name] = list(out[name])
        return out

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> AttemptFacts:
        return cls(
            attempt=int(raw["attempt"]), fingerprint=raw.get("fingerprint", ""),
            category=raw.get("category", ""),
            progress=tuple(raw.get("progress", (0, 0, 0)))[:3],  # type: ignore[arg-type]
            nodes=tuple(raw.get("nodes", ())), blamed=tuple(raw.get("blamed", ())),
            charged=bool(raw.get("charged", True)), action=raw.get("action", ""),
            rule=raw.get("rule", ""))


_FACT_FIELDS = tuple(f.name for f in fields(AttemptFacts))


def _lines(window: LogWindow) -> list[str]:
    return [*window.first_error, *window.tail]


def cause_line(window: LogWindow) -> str:
    """The line that reports the root cause: the first error line of the window that is not a
    cascade (the first error block comes first: it was printed before the tail's teardown).
    Falls back to the first cascade line, then to the last non-blank line."""
    fallback = ""
    for line in _lines(window):
        if not is_error_start(line):
            continue
        if _CASCADE.search(line):
            fallback = fallback or line
            continue
        return line
    if fallback:
        return fallback
    return next((ln for ln in reversed(window.tail) if ln.strip()), "")


def template(line: str) -> str:
    """The cause line with job-specific values masked and rank/host tags dropped, so the same
    error of another rank, step or run has the same template."""
    return " ".join(mask(_PREFIX.sub("", line)).split())


def fingerprint(category: str, line: str) -> str:
    """A short stable id of a root cause: category plus the masked template of its line."""
    return _fingerprint_of_template(category, template(line))


def _fingerprint_of_template(category: str, line_template: str) -> str:
    return hashlib.sha256(f"{category}\x00{line_template}".encode()).hexdigest()[:16]


def _highest(pattern: re.Pattern[str], text: str) -> int:
    """The highest number (group 1) ``pattern`` finds in ``text``; 0 when none."""
    return max(map(int, pattern.findall(text)), default=0)


def progress_of(lines: Iterable[str]) -> tuple[int, int, int]:
    """(highest epoch, highest step, checkpoints saved) printed in ``lines``."""
    text = "\n".join(lines).lower()
    epoch = _highest(_EPOCH, text)
    step = max(max(_highest(p, text) for p in _STEPS), _highest(_TQDM, text))
    saved = 0
    if "checkpoint" in text:
        saved = sum(1 for line in text.split("\n")
                    if "checkpoint" in line and _CHECKPOINT.search(line))
    return epoch, step, saved


def hardware_lines(lines: Sequence[str]) -> tuple[str, ...]:
    """The lines that report a hardware fault (Xid, ECC, fallen off the bus), in order."""
    text = "\n".join(lines).lower()
    if not any(key in text for key in _HARDWARE_KEYS):
        return ()
    return tuple(line for line in lines if _HARDWARE.search(line))


def blamed_nodes(lines: Sequence[str], nodes: Sequence[str], state: str | None
                 ) -> tuple[str, ...]:
    """Nodes the evidence blames. A node failure blames every node of the attempt (the
    scheduler does not say which one failed; on a one-node job that is exact). A hardware fault
    line (Xid, ECC, fallen off the bus) blames the attempt's nodes it names, or the only node
    of a one-node attempt when it names none. ``lines``: the window's, or only its
    :func:`hardware_lines` (the same answer)."""
    if state == "NODE_FAIL":
        return tuple(nodes)
    known = set(nodes)
    blamed: list[str] = []
    unnamed = False
    for line in hardware_lines(lines):
        named = [t for t in _HOST_TOKEN.findall(line) if t in known]
        if not named:
            unnamed = True
        blamed += [n for n in named if n not in blamed]
    if not blamed and unnamed and len(nodes) == 1:
        return (nodes[0],)
    return tuple(blamed)


def facts_of(attempt: int, reading: WindowReading, category: str, nodes: Sequence[str],
             state: str | None) -> AttemptFacts:
    """The facts of a failed attempt from its window's reading (``reading.py``); no
    fingerprint for an attempt that printed nothing."""
    tpl = reading.cause_template
    return AttemptFacts(
        attempt=attempt,
        fingerprint="" if tpl is None else _fingerprint_of_template(category, tpl),
        category=category,
        progress=reading.progress,
        nodes=tuple(nodes),
        blamed=blamed_nodes(reading.hardware_lines, nodes, state),
    )
