"""Confusion matrices as `sibylla evaluate --json` or an operator may give them."""

from __future__ import annotations

import json

import pytest

from sibylla.simulator.confusion import ASSUMED, ConfusionMatrix


@pytest.mark.parametrize(
    "doc",
    [
        {
            "deterministic": {"deterministic": 90, "nondeterministic": 10},
            "nondeterministic": {"deterministic": 5, "nondeterministic": 95},
        },
        {"labels": ["deterministic", "nondeterministic"], "matrix": [[90, 10], [5, 95]]},
        {
            "accuracy": 0.9,
            "confusion_matrix": {
                "labels": ["deterministic", "nondeterministic"],
                "matrix": [[90, 10], [5, 95]],
            },
        },
    ],
)
def test_accepted_json_shapes_give_the_same_rates(tmp_path, doc):
    path = tmp_path / "eval.json"
    path.write_text(json.dumps(doc))
    m = ConfusionMatrix.from_json(path)
    assert m.rates("deterministic") == pytest.approx((0.9, 0.1, 0.0))
    assert m.rates("nondeterministic") == pytest.approx((0.05, 0.95, 0.0))


def test_three_way_matrix_keeps_abstentions(tmp_path):
    labels = ["deterministic", "nondeterministic", "unknown"]
    path = tmp_path / "eval.json"
    path.write_text(json.dumps({"labels": labels, "matrix": [[8, 1, 1], [1, 8, 1], [0, 0, 0]]}))
    assert ConfusionMatrix.from_json(path).rates("deterministic") == pytest.approx((0.8, 0.1, 0.1))


def test_numbers_from_the_command_line():
    m = ConfusionMatrix.from_numbers("9,1,2,8")
    assert m.rates("nondeterministic") == pytest.approx((0.2, 0.8, 0.0))
    assert ConfusionMatrix.from_numbers("8,1,1,1,8,1").rates("deterministic")[2] == pytest.approx(
        0.1
    )


@pytest.mark.parametrize("spec", ["1,2,3", "a,b,c,d", "0,0,1,1", "-1,2,1,1"])
def test_bad_numbers_are_refused_with_a_reason(spec):
    with pytest.raises(ValueError):
        ConfusionMatrix.from_numbers(spec)


def test_a_report_without_a_matrix_is_refused(tmp_path):
    path = tmp_path / "eval.json"
    path.write_text(json.dumps({"accuracy": 0.9}))
    with pytest.raises(ValueError, match="no confusion matrix"):
        ConfusionMatrix.from_json(path)


def test_the_default_matrix_says_it_is_an_assumption():
    assert "ASSUMED" in ASSUMED.source


def test_the_report_of_sibylla_evaluate_json_is_read(tmp_path):
    report = {
        "accuracy": 0.9,
        "model_version": "v7",
        "model": {
            "accuracy": 0.9,
            "confusion": {
                "deterministic": {"deterministic": 45, "nondeterministic": 3, "unknown": 2},
                "nondeterministic": {"deterministic": 1, "nondeterministic": 48, "unknown": 1},
            },
        },
        "rows": {"regex rules": {"confusion": {}}},
    }
    path = tmp_path / "eval.json"
    path.write_text(json.dumps(report))
    m = ConfusionMatrix.from_json(path)
    assert m.rates("deterministic") == pytest.approx((0.90, 0.06, 0.04))
    assert m.rates("nondeterministic") == pytest.approx((0.02, 0.96, 0.02))
    assert "model v7" in m.source
