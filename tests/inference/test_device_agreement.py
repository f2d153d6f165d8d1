"""``bench/device_agreement.py``'s comparison: a verdict that one device withholds and the
other serves as ``do_not_retry`` must show up, since that is the difference a GPU deployment
would make to a job."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from sibylla.inference.api import Prediction

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from device_agreement import compare  # noqa: E402


def _p(verdict: str, confidence: float, category: str = "python_runtime_error") -> Prediction:
    return Prediction(verdict, confidence, category, ["line"])  # type: ignore[arg-type]


def test_identical_predictions_agree() -> None:
    same = [_p("deterministic", 0.99), _p("nondeterministic", 0.7, "collective_timeout")]
    report = compare(same, list(same), threshold=0.96)
    assert report["verdicts_differ"] == 0
    assert report["actions_differ"] == {}
    assert report["confidence_delta_max"] == 0.0


def test_a_do_not_retry_served_on_one_device_only_is_counted() -> None:
    cpu = [_p("deterministic", 0.961), _p("deterministic", 0.99), _p("nondeterministic", 0.6),
           _p("nondeterministic", 0.955, "collective_timeout")]
    cuda = [_p("deterministic", 0.958), _p("deterministic", 0.989), _p("nondeterministic", 0.61),
            _p("nondeterministic", 0.955, "collective_timeout")]
    report = compare(cpu, cuda, threshold=0.96)
    assert report["verdicts_differ"] == 0
    assert report["actions_differ"] == {"do_not_retry -> default_policy": 1}
    assert report["confidence_delta_max"] == pytest.approx(0.01)
    # Within the largest difference of the threshold: the first (0.001); not the second
    # (0.03 away), nor the last, a retry served whatever its confidence.
    assert report["near_threshold"] == 1


def test_a_flipped_verdict_counts_as_the_largest_difference() -> None:
    cpu = [_p("deterministic", 0.55)]
    cuda = [_p("nondeterministic", 0.52, "collective_timeout")]
    report = compare(cpu, cuda, threshold=0.96)
    assert report["verdicts_differ"] == 1
    assert report["categories_differ"] == 1
    assert report["actions_differ"] == {"default_policy -> retry": 1}
    assert report["confidence_delta_max"] == 1.0
