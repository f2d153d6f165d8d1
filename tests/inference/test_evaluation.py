"""Metrics, baselines and the evaluate/classify commands."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sibylla.cli import main
from sibylla.inference.baselines import ConstantVerdict, RegexRules, TfidfLogReg
from sibylla.inference.corpus import Record, load_records
from sibylla.inference.metrics import score
from sibylla.inference.preprocess import window_from_text
from sibylla.inference.synthetic import generate
from tests.inference.fixtures import NCCL_LOG, OOM_LOG


def test_abstention_costs_recall_but_not_precision() -> None:
    labels = ["deterministic", "deterministic", "nondeterministic", "nondeterministic"]
    verdicts = ["deterministic", "unknown", "nondeterministic", "deterministic"]
    m = score(labels, verdicts, ["a", "a", "b", "b"], ["a", "a", "b", "a"])
    assert m["accuracy"] == 0.5 and m["abstention_rate"] == 0.25
    assert m["deterministic_precision"] == 0.5 and m["per_class"]["deterministic"]["recall"] == 0.5
    assert m["decided_accuracy"] == pytest.approx(2 / 3, abs=1e-3)
    assert m["confusion"]["deterministic"] == {"deterministic": 1, "unknown": 1}
    assert m["per_category"]["b"]["category_accuracy"] == 0.5


def test_perfect_predictions_score_one() -> None:
    labels = ["deterministic", "nondeterministic"]
    m = score(labels, labels, ["x", "y"], ["x", "y"])
    assert m["macro_f1"] == 1.0 and m["accuracy"] == 1.0


def test_rules_retry_transient_looking_errors() -> None:
    a, b = RegexRules().predict([window_from_text(NCCL_LOG), window_from_text(OOM_LOG)])
    assert a.verdict == "nondeterministic" and b.verdict == "deterministic"
    assert {p.verdict for p in ConstantVerdict("nondeterministic").predict([
        window_from_text(OOM_LOG)])} == {"nondeterministic"}


def test_tfidf_baseline_learns_separable_categories() -> None:
    records = generate(160, seed=11)
    model = TfidfLogReg(steps=60).fit([window_from_text(r.log) for r in records],
                                      [r.category for r in records])
    predictions = model.predict([window_from_text(r.log) for r in records])
    correct = sum(p.verdict == r.label for p, r in zip(predictions, records, strict=True))
    assert correct / len(records) > 0.9


def test_corpus_files_are_validated(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"id": "1", "source": "s", "framework": "f",
                               "category": "gpu_out_of_memory", "label": "nondeterministic",
                               "log": "x"}) + "\n")
    with pytest.raises(ValueError, match="taxonomy"):
        load_records(bad)


def _write(records: list[Record], path: Path) -> Path:
    path.write_text("".join(r.to_json() + "\n" for r in records))
    return path


def test_evaluate_json_reports_the_model_and_every_baseline(
        tiny_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = _write(generate(32, seed=21), tmp_path / "test.jsonl")
    assert main(["evaluate", "--data", str(data), "--model", str(tiny_path), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    for key in ("accuracy", "macro_f1", "deterministic_precision", "abstention_rate"):
        assert 0.0 <= report[key] <= 1.0
    assert {"regex rules", "tf-idf + logistic regression", "always retry",
            "never retry"} <= set(report["rows"])
    assert report["rows"]["always retry"]["deterministic_precision"] == 0.0


def test_classify_prints_verdict_action_and_evidence(
        tiny_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "job.log"
    log.write_text(OOM_LOG)
    assert main(["classify", str(log), "--model", str(tiny_path), "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    for field in ("verdict:", "confidence:", "category:", "action:", "evidence:"):
        assert field in out


def test_classify_reports_a_broken_model_in_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "m.safetensors").write_bytes(b"junk")
    assert main(["classify", "-", "--model", str(tmp_path / "m.safetensors")]) == 2
    assert "sibylla classify:" in capsys.readouterr().err
