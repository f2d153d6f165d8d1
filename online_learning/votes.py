"""Votes on a failed attempt's true class and the weighted-majority rule that turns them into a
Label. Pure functions and one immutable record, so the rule is tested without a broker.

Three kinds of vote:

- the **retry outcome** (source ``outcome``): the job's next attempt COMPLETED → the failure was
  ``nondeterministic``; it failed again with the same normalized error signature →
  ``deterministic``; a different error → no vote (the first cause may have been fixed, or a new
  fault hit: nothing is learned about the first one);
- the **committee** (sources ``model:<name>``): each model's confident verdict on the window,
  weighted by ``committee_weight × confidence``; an ``unknown`` verdict casts no vote;
- an **operator** (source ``operator``), whose weight outweighs every other vote together.

The rule: the label with the larger summed weight wins when that weight reaches ``min_weight``
and its margin over the other label reaches ``min_margin`` (a tie never labels). With the
defaults (outcome 2, each of three models at most 0.5, operator 10) an outcome alone labels,
an outcome beats a unanimous committee that disagrees with it (that is how the loop learns what
the models get wrong), and a committee alone labels only when three models agree with full
confidence.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import orjson

from sibylla.inference.api import ERROR_START, LogWindow, Prediction
from sibylla.inference.preprocess import mask, redact, redact_lines
from sibylla.schemas.records import Label, RecordError, Vote, job_key, load_json_object

__all__ = [
    "OPERATOR",
    "OUTCOME",
    "AttemptRecord",
    "TrueLabel",
    "VoteRule",
    "committee_votes",
    "error_signature",
    "independent",
    "operator_vote",
    "outcome_vote",
    "operator_request",
    "parse_operator_request",
    "tally",
    "window_text",
]

TrueLabel = Literal["deterministic", "nondeterministic"]
OUTCOME = "outcome"
OPERATOR = "operator"
MODEL_PREFIX = "model:"
RECORD_VERSION = 1

_DIGITS = re.compile(r"\d+")
_SPACES = re.compile(r"\s+")
_TRACEBACK = "Traceback (most recent call last)"


@dataclass(frozen=True)
class VoteRule:
    """Weights of each kind of vote and what a majority needs (see the module docstring);
    built from the settings by :meth:`OnlineSettings.vote_rule`, where the defaults live."""

    operator_weight: float
    outcome_weight: float
    committee_weight: float
    min_weight: float
    min_margin: float


def tally(votes: Iterable[Vote], rule: VoteRule) -> TrueLabel | None:
    """The majority label, or None for a tie or thin evidence."""
    det = nondet = 0.0
    for vote in votes:
        if vote.label == "deterministic":
            det += vote.weight
        else:
            nondet += vote.weight
    margin = abs(det - nondet)
    if max(det, nondet) < rule.min_weight or margin < rule.min_margin or margin == 0:
        return None
    return "deterministic" if det > nondet else "nondeterministic"


def independent(votes: Iterable[Vote]) -> bool:
    """True when some vote did not come from a model (the label is not the models' own echo)."""
    return any(not v.source.startswith(MODEL_PREFIX) for v in votes)


def committee_votes(predictions: Mapping[str, Prediction], rule: VoteRule) -> list[Vote]:
    """One vote per model with a confident verdict (``unknown`` abstains)."""
    return [Vote(MODEL_PREFIX + name, p.verdict, round(rule.committee_weight * p.confidence, 4))
            for name, p in sorted(predictions.items()) if p.verdict != "unknown"]


def operator_vote(label: TrueLabel, rule: VoteRule, by: str) -> Vote:
    """The vote of the operator named ``by``."""
    return Vote(OPERATOR, label, rule.operator_weight, by)


def operator_request(job_id: str, attempt: int, label: str, operator: str) -> bytes:
    """The record an operator's label travels in from ``POST /labels`` (where the bearer
    token named ``operator``) to the label-votes topic."""
    return orjson.dumps({"job_id": job_id, "attempt": attempt, "label": label,
                         "operator": operator})


def parse_operator_request(value: bytes) -> tuple[str, int, TrueLabel, str]:
    """(job_id, attempt, label, operator) of an operator's label; :class:`RecordError` says
    what is wrong with a bad one."""
    raw = load_json_object(value)
    job_id, attempt = job_key(raw)
    label = raw.get("label")
    if label not in ("deterministic", "nondeterministic"):
        raise RecordError("label must be deterministic or nondeterministic")
    operator = raw.get("operator", "")
    if not isinstance(operator, str):
        raise RecordError("operator must be a string")
    return job_id, attempt, label, operator


def outcome_vote(signature: str, next_completed: bool, next_signature: str | None,
                 rule: VoteRule) -> Vote | None:
    """The retry outcome's vote on an attempt whose signature is ``signature``.

    ``next_completed``: the next attempt finished COMPLETED; otherwise ``next_signature`` is the
    next failure's signature. Two empty signatures (no error line at all) tell nothing.
    """
    if next_completed:
        return Vote(OUTCOME, "nondeterministic", rule.outcome_weight)
    if signature and signature == next_signature:
        return Vote(OUTCOME, "deterministic", rule.outcome_weight)
    return None


def error_signature(window: LogWindow) -> str:
    """The first error message of the window, from where the error starts, with every number,
    path and host masked: equal for two attempts that died of the same cause, whichever rank
    printed it and whatever the launcher put before it. Empty when no line looks like an error.
    """
    for line in window.first_error or window.tail:
        found = ERROR_START.search(line)
        if found is None or _TRACEBACK in line:
            continue  # the traceback header is the same for every Python error
        text = _DIGITS.sub("#", mask(redact(line[found.start():])))
        return _SPACES.sub(" ", text).strip()
    return ""


def window_text(window: LogWindow) -> str:
    """The log text a label carries, secrets redacted: the first error block, then the tail
    (the block once when the tail already holds it). ``window_from_text`` rebuilds the window
    from it, so the trainer sees what the stream saw."""
    lines = window.tail
    if window.first_error and not set(window.first_error) <= set(window.tail):
        lines = window.first_error + window.tail
    return "\n".join(redact_lines(lines))


@dataclass(frozen=True)
class AttemptRecord:
    """What the votes agent keeps per failed attempt (the ``votes`` table's value)."""

    job_id: str
    attempt: int
    log: str = ""
    category: str = ""
    signature: str = ""
    decided: bool = False  # the window is known (the decision came)
    votes: dict[str, Vote] = field(default_factory=dict)  # one per source: the latest
    published: TrueLabel | None = None
    created_at: float = 0.0  # when the first vote or the window came (for expiry)

    def with_vote(self, vote: Vote) -> AttemptRecord:
        return replace(self, votes={**self.votes, vote.source: vote})

    def label_due(self, rule: VoteRule) -> Label | None:
        """The Label to publish now: the majority, when known and unlike the one published."""
        if not self.decided:
            return None
        label = tally(self.votes.values(), rule)
        if label is None or label == self.published:
            return None
        return Label(self.job_id, self.attempt, label, list(self.votes.values()), self.log,
                     self.category, time.time())

    def to_bytes(self) -> bytes:
        raw: dict[str, Any] = {
            "v": RECORD_VERSION, "job_id": self.job_id, "attempt": self.attempt, "log": self.log,
            "category": self.category, "signature": self.signature, "decided": self.decided,
            "published": self.published, "created_at": self.created_at,
            "votes": [[v.source, v.label, v.weight, v.by] for v in self.votes.values()],
        }
        return orjson.dumps(raw)

    @classmethod
    def from_bytes(cls, value: bytes) -> AttemptRecord:
        raw = orjson.loads(value)
        if raw.get("v") != RECORD_VERSION:
            raise ValueError(f"votes record version {raw.get('v')!r}, expected {RECORD_VERSION}")
        # [source, label, weight, by]; records written before ``by`` existed have three
        votes = {v[0]: Vote(*v) for v in raw["votes"]}
        return cls(raw["job_id"], raw["attempt"], raw["log"], raw["category"], raw["signature"],
                   raw["decided"], votes, raw["published"], raw["created_at"])
