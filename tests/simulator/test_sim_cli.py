"""The two commands as an operator runs them."""

from __future__ import annotations

import json
import re

import pytest

from sibylla.cli import main
from tests.simulator.fixtures import CORPUS, KeywordClassifier


def test_simulate_prints_every_policy_as_json(capsys, tmp_path):
    code = main(
        [
            "simulate",
            "--jobs",
            "1500",
            "--json",
            "--confusion",
            "90,10,3,97",
            "--out",
            str(tmp_path),
        ]
    )
    report = json.loads(capsys.readouterr().out)
    assert code == 0
    assert [p["policy"] for p in report["policies"]] == [
        "fixed-3", "never", "oracle", "sibylla", "sibylla-job", "sibylla-memory"]
    assert report["confusion_source"].startswith("command line")
    assert (tmp_path / "gpu_hours_by_policy.png").stat().st_size > 0
    assert (tmp_path / "jct_cdf.png").stat().st_size > 0


def test_simulate_table_says_when_the_matrix_is_assumed(capsys):
    assert main(["simulate", "--jobs", "800", "--no-plots", "--servers", "20"]) == 0
    out = capsys.readouterr().out
    assert "ASSUMED" in out and "20 servers x 8 GPUs" in out and "sibylla" in out


def test_reliability_reports_the_published_mttf_and_plots(capsys, tmp_path):
    assert main(["reliability", "--replicas", "200", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "6.500e-03" in out
    assert re.search(r"\b16,384\s+2,048\s+1\.80\s", out)  # GPUs, nodes, MTTF hours
    assert re.search(r"\b131,072\s+16,384\s+0\.23\s", out)
    assert (tmp_path / "mttf_vs_gpus.png").exists() and (tmp_path / "ettr_vs_interval.png").exists()


def test_reliability_estimates_the_rate_from_job_events(capsys, tmp_path):
    events = tmp_path / "events.jsonl"
    lines = []
    for i in range(10):
        lines.append(
            {
                "job_id": f"j{i}",
                "attempt": 0,
                "event": "started",
                "ts": 0,
                "nodes": ["a", "b"],
                "gpus": 16,
            }
        )
        lines.append(
            {
                "job_id": f"j{i}",
                "attempt": 0,
                "event": "finished",
                "ts": 86_400 * 5,
                "state": "NODE_FAIL" if i < 2 else "COMPLETED",
                "nodes": ["a", "b"],
                "gpus": 16,
            }
        )
    events.write_text("\n".join(json.dumps(x) for x in lines) + "\nnot json\n")
    assert main(["reliability", "--events", str(events), "--no-plots", "--replicas", "50"]) == 0
    out = capsys.readouterr().out
    assert "r_f = 2.000e-02" in out  # 2 failures over 100 node-days
    assert "95% CI" in out and "1 bad records" in out


def test_simulate_with_the_model_adds_its_row(capsys, tmp_path, monkeypatch):
    import sibylla.inference

    loaded = []

    def load_classifier(path=None):
        loaded.append(path)
        return KeywordClassifier()

    # Through the module's dict: the package resolves load_classifier lazily (importing torch).
    monkeypatch.setitem(vars(sibylla.inference), "load_classifier", load_classifier)
    corpus = tmp_path / "logs.jsonl"
    corpus.write_text("\n".join(json.dumps(e) for e in CORPUS))
    argv = [
        "simulate",
        "--jobs",
        "1000",
        "--json",
        "--no-plots",
        "--model",
        "m.safetensors",
        "--model-logs",
        str(corpus),
    ]
    assert main(argv) == 0
    rows = {p["policy"]: p for p in json.loads(capsys.readouterr().out)["policies"]}
    assert loaded == ["m.safetensors"]
    assert rows["sibylla-model"]["futile_retry_gpu_h"] == rows["oracle"]["futile_retry_gpu_h"]


def test_reliability_without_failures_gives_the_upper_bound_only(capsys, tmp_path):
    events = tmp_path / "events.jsonl"
    events.write_text(
        json.dumps({"job_id": "a", "event": "started", "ts": 0, "nodes": ["n1"]})
        + "\n"
        + json.dumps(
            {
                "job_id": "a",
                "event": "finished",
                "ts": 86_400,
                "state": "COMPLETED",
                "nodes": ["n1"],
            }
        )
        + "\n"
    )
    assert main(["reliability", "--events", str(events), "--no-plots"]) == 1
    assert "upper bound 3.69e+00 per node-day" in capsys.readouterr().err


def test_reliability_from_a_philly_trace_says_it_is_an_upper_bound(capsys, tmp_path):
    trace = tmp_path / "cluster_job_log"
    trace.write_text(
        json.dumps(
            [
                {
                    "status": "Pass",
                    "jobid": "n",
                    "submitted_time": "2017-10-07 00:00:00",
                    "attempts": [
                        {
                            "start_time": "2017-10-07 00:00:00",
                            "end_time": "2017-10-08 00:00:00",
                            "detail": [
                                {"ip": "m1", "gpus": ["gpu0"]},
                                {"ip": "m2", "gpus": ["gpu0"]},
                            ],
                        },
                        {
                            "start_time": "2017-10-08 00:00:00",
                            "end_time": "2017-10-09 00:00:00",
                            "detail": [
                                {"ip": "m3", "gpus": ["gpu0"]},
                                {"ip": "m4", "gpus": ["gpu0"]},
                            ],
                        },
                    ],
                },
            ]
        )
    )
    assert main(["reliability", "--philly", str(trace), "--no-plots", "--replicas", "50"]) == 0
    out = capsys.readouterr().out
    assert "r_f = 2.500e-01" in out  # 1 failure over 4 node-days
    assert "an upper bound" in out


@pytest.mark.parametrize(
    "argv", [["--retry-success", "1.5"], ["--load", "0"], ["--jobs", "0"], ["--servers", "0"]]
)
def test_simulate_refuses_impossible_settings_with_a_reason(capsys, argv):
    assert main(["simulate", "--no-plots", *argv]) == 2
    assert "sibylla simulate: --" in capsys.readouterr().err
