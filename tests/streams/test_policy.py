"""What the scheduler is told to do for each kind of verdict."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sibylla.inference.api import LogWindow, Prediction
from sibylla.schemas.records import JobEvent
from sibylla.streams.policy import explore_draw, make_decision

EVENT = JobEvent("j", 1, "finished", "FAILED", 1, None, ("gpu-1", "gpu-2"), 16)
WINDOW = LogWindow("j", 1, ["line"], [], 1)


def _decide(prediction: Prediction | None, event: JobEvent = EVENT,
            window: LogWindow = WINDOW):
    return make_decision(event, window, prediction, "m1", decided_at=10.25, event_time=10.0)


def test_deterministic_failures_are_not_retried() -> None:
    d = _decide(Prediction("deterministic", 0.99, "syntax_error", ["SyntaxError"]))
    assert (d.action, d.avoid_nodes, d.latency_ms) == ("do_not_retry", [], 250.0)


def test_hardware_failures_are_retried_elsewhere_avoiding_the_nodes() -> None:
    d = _decide(Prediction("nondeterministic", 0.9, "gpu_hardware_error", ["Xid 79"]))
    assert (d.action, d.avoid_nodes) == ("retry_elsewhere", ["gpu-1", "gpu-2"])


def test_transient_network_failures_are_retried_in_place() -> None:
    assert _decide(Prediction("nondeterministic", 0.9, "connection_error", [])).action == "retry"


def test_low_confidence_and_missing_logs_keep_the_default_policy() -> None:
    assert _decide(Prediction("unknown", 0.55, "config_error", [])).action == "default_policy"
    silent = _decide(None, window=LogWindow("j", 1, []))
    assert (silent.verdict, silent.action, silent.category) == (
        "unknown", "default_policy", "no_log")


def test_a_site_that_does_not_retry_keeps_its_default_for_unsure_transient_verdicts() -> None:
    """The model withholds only deterministic verdicts; below min_retry_confidence a
    transient one is acted on by the site's default, not retried, but a node the scheduler
    saw fail still sends the job elsewhere."""
    unsure = Prediction("nondeterministic", 0.6, "gpu_hardware_error", ["Xid 79"])

    def action(prediction: Prediction, floor: float, state: str = "FAILED") -> str:
        event = JobEvent("j", 1, "finished", state, 1, None, ("gpu-1",), 8)
        return make_decision(event, WINDOW, prediction, "m1", decided_at=10.25,
                             event_time=10.0, min_retry_confidence=floor).action

    assert action(unsure, 0.0) == "retry_elsewhere"  # the default: every one is acted on
    assert action(unsure, 0.9) == "default_policy"
    assert action(unsure, 0.9, state="NODE_FAIL") == "retry_elsewhere"
    sure = Prediction("nondeterministic", 0.95, "connection_error", [])
    assert action(sure, 0.9) == "retry"


# ---------------------------------------------------------------- exploration
# A share of deterministic verdicts is sent as default_policy, so that the scheduler retries
# them and the retry's outcome can refute a wrong verdict (online learning).

job_ids = st.text(min_size=1, max_size=40)
attempts = st.integers(0, 50)
rates = st.floats(0.0, 1.0)
predictions = st.builds(
    Prediction,
    st.sampled_from(["deterministic", "nondeterministic", "unknown"]),
    st.floats(0.0, 1.0),
    st.sampled_from(["syntax_error", "gpu_hardware_error", "connection_error", "oom"]),
    st.just(["evidence line"]))


def _explore(job_id: str, attempt: int, prediction: Prediction | None,
             rate: float | None, lines: list[str] | None = None):
    """The decision at this explore rate (None: make_decision's default)."""
    event = JobEvent(job_id, attempt, "finished", "FAILED", 1, None, ("gpu-1",), 8)
    window = LogWindow(job_id, attempt, ["line"] if lines is None else lines, [], 1)
    extra = {} if rate is None else {"explore_rate": rate}
    return make_decision(event, window, prediction, "m1", decided_at=10.25, event_time=10.0,
                         **extra)


DETERMINISTIC = Prediction("deterministic", 0.97, "syntax_error", ["SyntaxError"])


@settings(max_examples=300, deadline=None)
@given(job_ids, attempts, predictions)
def test_exploration_is_off_unless_the_operator_sets_a_rate(
        job_id: str, attempt: int, prediction: Prediction) -> None:
    default, zero = _explore(job_id, attempt, prediction, None), _explore(job_id, attempt,
                                                                          prediction, 0.0)
    assert default == zero
    assert zero.explored is False
    if prediction.verdict == "deterministic":
        assert zero.action == "do_not_retry"


@settings(max_examples=300, deadline=None)
@given(job_ids, attempts, predictions)
def test_rate_one_explores_every_deterministic_verdict_and_nothing_else(
        job_id: str, attempt: int, prediction: Prediction) -> None:
    d, plain = _explore(job_id, attempt, prediction, 1.0), _explore(job_id, attempt,
                                                                    prediction, 0.0)
    if prediction.verdict == "deterministic":
        assert (d.action, d.explored) == ("default_policy", True)
    else:
        assert d == plain  # a retry (or the default policy) is never changed
    # What the model said is reported unchanged, explored or not: votes and dashboards see it.
    assert (d.verdict, d.confidence, d.category, d.evidence) == (
        plain.verdict, plain.confidence, plain.category, plain.evidence)


def test_an_explored_decision_keeps_the_verdict_and_only_changes_the_action() -> None:
    d = _explore("job-7", 0, DETERMINISTIC, 1.0)
    assert (d.verdict, d.confidence, d.category, d.evidence) == (
        "deterministic", 0.97, "syntax_error", ["SyntaxError"])
    assert (d.action, d.explored, d.avoid_nodes) == ("default_policy", True, [])


def test_a_silent_attempt_is_never_explored() -> None:
    d = _explore("job-silent", 0, None, 1.0, lines=[])
    assert (d.verdict, d.action, d.explored) == ("unknown", "default_policy", False)


@settings(max_examples=300, deadline=None)
@given(job_ids, attempts, rates)
def test_a_replayed_decision_explores_the_same_way(job_id: str, attempt: int,
                                                   rate: float) -> None:
    first = _explore(job_id, attempt, DETERMINISTIC, rate)
    again = _explore(job_id, attempt, DETERMINISTIC, rate)
    assert (again.action, again.explored) == (first.action, first.explored)
    assert first.explored == (explore_draw(job_id, attempt) < rate)


@settings(max_examples=300, deadline=None)
@given(job_ids, attempts, rates, rates)
def test_raising_the_rate_only_adds_explored_attempts(job_id: str, attempt: int, a: float,
                                                      b: float) -> None:
    low, high = sorted((a, b))
    if _explore(job_id, attempt, DETERMINISTIC, low).explored:
        assert _explore(job_id, attempt, DETERMINISTIC, high).explored


@pytest.mark.parametrize("rate", [0.02, 0.1, 0.5])
def test_the_explored_share_is_close_to_the_rate(rate: float) -> None:
    n = 10_000
    explored = sum(_explore(f"job-{i}", i % 3, DETERMINISTIC, rate).explored for i in range(n))
    assert abs(explored / n - rate) <= 0.02


def test_the_next_attempt_of_a_job_is_drawn_anew() -> None:
    # Exploration is by attempt: a job explored once is not explored on every attempt.
    explored = [_explore("job-retried", a, DETERMINISTIC, 0.5).explored for a in range(64)]
    assert 0 < sum(explored) < 64


@given(job_ids, attempts, st.floats(0.0, 1.0), st.floats(0.0, 1.0))
def test_exploration_can_be_kept_to_the_unsure_deterministic_verdicts(
        job_id: str, attempt: int, confidence: float, bound: float) -> None:
    """With a confidence bound, only verdicts at most that sure are ever retried to learn."""
    prediction = Prediction("deterministic", confidence, "syntax_error", ["SyntaxError"])
    event = JobEvent(job_id, attempt, "finished", "FAILED", 1, None, ("gpu-1",), 8)
    d = make_decision(event, LogWindow(job_id, attempt, ["line"], [], 1), prediction, "m1",
                      decided_at=10.25, event_time=10.0, explore_rate=1.0,
                      explore_max_confidence=bound)
    assert d.explored == (confidence <= bound)
    assert d.action == ("default_policy" if confidence <= bound else "do_not_retry")
    assert (d.verdict, d.confidence) == ("deterministic", round(confidence, 4))
