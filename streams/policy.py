"""From a model's prediction to the action the scheduler takes.

Kept apart from the model so operators can reason about it: the model says *what* failed and
how sure it is; this module says what a scheduler should do about it.
"""

from __future__ import annotations

from sibylla.inference.api import LogWindow, Prediction
from sibylla.schemas.records import Action, Decision, JobEvent

__all__ = ["NO_LOG_CATEGORY", "RETRY_ELSEWHERE_CATEGORIES", "make_decision"]

NO_LOG_CATEGORY = "no_log"

# Failures tied to the machines the attempt ran on: retry, but not on those nodes.
RETRY_ELSEWHERE_CATEGORIES = frozenset(
    {"gpu_hardware_error", "node_failure_or_preemption", "nccl_network_error"}
)
_NODE_STATES = frozenset({"NODE_FAIL"})
_MAX_EVIDENCE = 5


def _action(prediction: Prediction, event: JobEvent) -> Action:
    if prediction.verdict == "deterministic":
        return "do_not_retry"
    if prediction.verdict == "nondeterministic":
        if prediction.category in RETRY_ELSEWHERE_CATEGORIES or event.state in _NODE_STATES:
            return "retry_elsewhere"
        return "retry"
    return "default_policy"


def make_decision(
    event: JobEvent,
    window: LogWindow,
    prediction: Prediction | None,
    model_version: str,
    decided_at: float,
    event_time: float,
) -> Decision:
    """The decision for a failed attempt.

    ``prediction`` is None when the attempt printed nothing: with no evidence Sibylla does not
    guess, the verdict is ``unknown`` and the scheduler keeps its default policy.
    """
    if prediction is None or window.empty:
        prediction = Prediction("unknown", 0.0, NO_LOG_CATEGORY, [])
    action = _action(prediction, event)
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
    )
