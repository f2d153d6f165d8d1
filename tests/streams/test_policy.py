"""What the scheduler is told to do for each kind of verdict."""

from __future__ import annotations

from sibylla.inference.api import LogWindow, Prediction
from sibylla.schemas.records import JobEvent
from sibylla.streams.policy import make_decision

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
