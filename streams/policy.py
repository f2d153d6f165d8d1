"""From a model's prediction to the action the scheduler takes.

Kept apart from the model so operators can reason about it: the model says *what* failed and
how sure it is; this module says what a scheduler should do about it.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

from sibylla.inference.api import LogWindow, Prediction
from sibylla.schemas.records import Action, Decision, JobEvent
from sibylla.streams.attempts import AttemptFacts

__all__ = ["BLAMING_RULES", "CLASSIFIER_ERROR_CATEGORY", "NO_LOG_CATEGORY",
           "NOT_JOB_FAULT_STATES", "RETRY_ELSEWHERE_CATEGORIES", "Rules", "action_for",
           "apply_memory", "explore_draw", "explores", "make_decision"]

NO_LOG_CATEGORY = "no_log"
# The model failed on this window alone (its batch-mates were decided): verdict unknown.
CLASSIFIER_ERROR_CATEGORY = "classifier_error"

# Failures tied to the machines the attempt ran on: retry, but not on those nodes.
RETRY_ELSEWHERE_CATEGORIES = frozenset(
    {"gpu_hardware_error", "node_failure_or_preemption", "nccl_network_error"}
)
_NODE_STATES = frozenset({"NODE_FAIL"})
# The scheduler saw the machine die under the job: whatever the log says, the job is not at
# fault, a retry elsewhere is due and it does not use up the job's retry budget.
NOT_JOB_FAULT_STATES = _NODE_STATES
_RETRIES = frozenset({"retry", "retry_elsewhere", "default_policy"})
# Rules whose decisions' avoid_nodes are nodes the evidence blames (not merely where a
# transient failure happened): what `sibylla nodes` and the node-blame metric count.
BLAMING_RULES = frozenset({"hardware_blamed", "not_job_fault"})
_MAX_EVIDENCE = 5


def action_for(prediction: Prediction, state: str | None = None,
               min_retry_confidence: float = 0.0) -> Action:
    """What the scheduler should do about a verdict (``state``: the attempt's final state, when
    known; a node failure sends even an unremarkable transient failure elsewhere).

    The model withholds only deterministic verdicts (``inference.engine.at_threshold``): a
    transient one below ``min_retry_confidence`` gets the site's default policy instead, for
    sites that do not retry failed jobs, unless the scheduler saw the node fail."""
    if prediction.verdict == "deterministic":
        return "do_not_retry"
    if prediction.verdict == "nondeterministic":
        if state in _NODE_STATES:
            return "retry_elsewhere"
        if prediction.confidence < min_retry_confidence:
            return "default_policy"
        if prediction.category in RETRY_ELSEWHERE_CATEGORIES:
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
    min_retry_confidence: float = 0.0,
) -> Decision:
    """The decision for a failed attempt.

    ``prediction`` is None when the attempt printed nothing: with no evidence Sibylla does not
    guess, the verdict is ``unknown`` and the scheduler keeps its default policy.

    ``explore_rate``: the share of ``deterministic`` verdicts whose action becomes
    ``default_policy`` (the decision is marked ``explored``), so that the scheduler retries them
    and the retry's outcome votes on the verdict in online learning; otherwise a
    ``do_not_retry`` job never gets an outcome vote. The verdict, confidence and category stay
    the model's. ``explore_max_confidence``: see :func:`explores`; ``min_retry_confidence``:
    see :func:`action_for`.
    """
    if prediction is None or window.empty:
        prediction = Prediction("unknown", 0.0, NO_LOG_CATEGORY, [])
    action = action_for(prediction, event.state, min_retry_confidence)
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


@dataclass(frozen=True, slots=True)
class Rules:
    """The settings of the policy with memory (``policy_*`` in ``sibylla/settings.py``)."""

    max_retries: int = 3
    max_recurrence: int = 2  # unsure verdicts (default_policy)
    max_recurrence_transient: int = 3  # nondeterministic verdicts (retry, retry_elsewhere)
    max_excluded_nodes: int = 4


def _first_rule(decision: Decision) -> str:
    """The rule behind a memoryless decision."""
    if decision.category == NO_LOG_CATEGORY:
        return "no_log"
    if decision.explored:
        return "explore"
    return {"do_not_retry": "deterministic", "retry": "transient",
            "retry_elsewhere": "transient_elsewhere"}.get(decision.action, "unsure")


def _capped(nodes: Sequence[str], cap: int) -> list[str]:
    """Distinct nodes, the most recently blamed kept when over ``cap``."""
    seen: list[str] = []
    for node in reversed(nodes):
        if node not in seen:
            seen.append(node)
    return list(reversed(seen[:cap]))


def apply_memory(decision: Decision, facts: AttemptFacts, history: Sequence[AttemptFacts],
                 rules: Rules) -> tuple[Decision, AttemptFacts]:
    """The memoryless ``decision`` for an attempt, revised by the job's earlier attempts, and
    the facts to remember of this one. Rules, first match wins:

    1. ``not_job_fault``: the attempt ended in NODE_FAIL: retry elsewhere, the failed nodes
       excluded; the job's budget is not charged.
    2. ``deterministic`` (or ``explore``): the model's verdict stands (do_not_retry, or
       default_policy when explored).
    3. ``same_root_recurred``: this root (fingerprint) ended ``max_recurrence`` attempts (for
       an unsure verdict; ``max_recurrence_transient`` for a nondeterministic one) and this one
       got no further than the earlier ones: do_not_retry. An unsure verdict therefore gets one
       retry (the site's default policy) and stops when its root comes back; a transient error
       that keeps killing the job at the same point is likely not transient.
    4. ``retry_budget_spent``: the job already used ``max_retries`` retries: do_not_retry.
    5. ``hardware_blamed``: a transient failure whose log blames nodes (Xid, ECC): retry
       elsewhere, off those nodes. Otherwise the memoryless action stands (``transient``,
       ``transient_elsewhere``, ``unsure``, ``no_log``).

    ``exclude_nodes``: every node blamed by this or an earlier attempt (the newest
    ``max_excluded_nodes``), plus this attempt's nodes when it is sent elsewhere.
    """
    earlier = [h for h in history if h.attempt < facts.attempt]
    best = max((h.progress for h in earlier), default=(0, 0, 0))
    progressed = facts.progress > best
    recurrence = 1 + sum(1 for h in earlier if facts.fingerprint
                         and h.fingerprint == facts.fingerprint)
    spent = sum(1 for h in earlier if h.charged)
    action: Action = decision.action
    rule = _first_rule(decision)
    charged = True
    if decision.state in NOT_JOB_FAULT_STATES:
        action, rule, charged = "retry_elsewhere", "not_job_fault", False
    elif decision.action == "do_not_retry" or decision.explored:
        pass
    elif recurrence >= (rules.max_recurrence if action == "default_policy"
                        else rules.max_recurrence_transient) and not progressed:
        action, rule = "do_not_retry", "same_root_recurred"
    elif spent >= rules.max_retries:
        action, rule = "do_not_retry", "retry_budget_spent"
    elif action in ("retry", "retry_elsewhere") and facts.blamed:
        action, rule = "retry_elsewhere", "hardware_blamed"
    avoid = (list(facts.blamed) or list(facts.nodes)) if action == "retry_elsewhere" else []
    blamed_before = [n for h in earlier for n in h.blamed]
    exclude = _capped([*blamed_before, *facts.blamed, *avoid], rules.max_excluded_nodes)
    retries_left = max(0, rules.max_retries - spent - (charged and action in _RETRIES))
    revised = dataclasses.replace(
        decision, action=action, avoid_nodes=avoid, fingerprint=facts.fingerprint,
        recurrence=recurrence, progressed=progressed, exclude_nodes=exclude,
        retries_left=retries_left, rule=rule)
    remembered = dataclasses.replace(facts, charged=charged, action=action, rule=rule)
    return revised, remembered
