"""From a model's prediction to the action the scheduler takes.

Kept apart from the model so operators can reason about it: the model says *what* failed and
how sure it is; this module says what a scheduler should do about it.
"""

from __future__ import annotations

import hashlib

from sibylla.inference.api import LogWindow, Prediction
from sibylla.schemas.records import Action, Decision, JobEvent

__all__ = ["CLASSIFIER_ERROR_CATEGORY", "NO_LOG_CATEGORY", "RETRY_ELSEWHERE_CATEGORIES",
           "action_for", "explore_draw", "explores", "make_decision"]

NO_LOG_CATEGORY = "no_log"
# The model failed on this window alone (its batch-mates were decided): verdict unknown.
CLASSIFIER_ERROR_CATEGORY = "classifier_error"

# Failures tied to the machines the attempt ran on: retry, but not on those nodes.
RETRY_ELSEWHERE_CATEGORIES = frozenset(
    {"gpu_hardware_error", "node_failure_or_preemption", "nccl_network_error"}
)
_NODE_STATES = frozenset({"NODE_FAIL"})
_MAX_EVIDENCE = 5


def action_for(prediction: Prediction, state: str | None = None) -> Action:
    """What the scheduler should do about a verdict (``state``: the attempt's final state, when
    known; a node failure sends even an unremarkable transient failure elsewhere)."""
    if prediction.verdict == "deterministic":
        return "do_not_retry"
    if prediction.verdict == "nondeterministic":
        if prediction.category in RETRY_ELSEWHERE_CATEGORIES or state in _NODE_STATES:
            return "retry_elsewhere"
        return "retry"
    return "default_policy"


def explore_draw(job_id: str, attempt: int) -> float:
    """A number in [0, 1) fixed by the attempt: an attempt is explored when it is below the
    rate. A hash, not a random draw, so a decision made again after a crash (replay) is the
    same; the prefix keeps it independent of other hashes of the attempt (the trainer's
    hold-out choice)."""
    digest = hashlib.sha256(f"explore\x00{job_id}\x00{attempt}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64


def explores(job_id: str, attempt: int, prediction: Prediction, rate: float,
             max_confidence: float = 1.0) -> bool:
    """Whether this verdict is explored: a ``deterministic`` one, at most ``max_confidence``
    sure, whose attempt's draw is below ``rate``.

    Why the confidence bound: on the drift experiment's stream the initial model's wrong
    ``deterministic`` verdicts were mostly unsure (75 % below 0.9) and its right ones mostly
    sure (25 % below 0.9), so retrying only the unsure ones buys more outcome votes on wrong
    verdicts for fewer futile retries than a uniform share.
    """
    return (prediction.verdict == "deterministic" and prediction.confidence <= max_confidence
            and explore_draw(job_id, attempt) < rate)


def make_decision(
    event: JobEvent,
    window: LogWindow,
    prediction: Prediction | None,
    model_version: str,
    decided_at: float,
    event_time: float,
    *,
    explore_rate: float = 0.0,
    explore_max_confidence: float = 1.0,
) -> Decision:
    """The decision for a failed attempt.

    ``prediction`` is None when the attempt printed nothing: with no evidence Sibylla does not
    guess, the verdict is ``unknown`` and the scheduler keeps its default policy.

    ``explore_rate``: the share of ``deterministic`` verdicts whose action becomes
    ``default_policy`` (the decision is marked ``explored``), so that the scheduler retries them
    and the retry's outcome votes on the verdict in online learning; otherwise a
    ``do_not_retry`` job never gets an outcome vote. The verdict, confidence and category stay
    the model's. ``explore_max_confidence``: see :func:`explores`.
    """
    if prediction is None or window.empty:
        prediction = Prediction("unknown", 0.0, NO_LOG_CATEGORY, [])
    action = action_for(prediction, event.state)
    explored = explores(event.job_id, event.attempt, prediction, explore_rate,
                        explore_max_confidence)
    if explored:
        action = "default_policy"
    return Decision(
        job_id=event.job_id,
        attempt=event.attempt,
        verdict=prediction.verdict,
        confidence=round(float(prediction.confidence), 4),
        category=prediction.category,
        action=action,
        avoid_nodes=list(event.nodes) if action == "retry_elsewhere" else [],
        evidence=prediction.evidence[:_MAX_EVIDENCE],
        model_version=model_version,
        decided_at=decided_at,
        latency_ms=round(max(0.0, decided_at - event_time) * 1000.0, 3),
        state=event.state or "",
        line_count=window.line_count,
        explored=explored,
    )
