"""Sibylla driven by a classifier on generated logs, one verdict per failing job."""

from __future__ import annotations

import pytest

from sibylla.simulator.metrics import measure
from sibylla.simulator.model_policy import corpus_logs, generated_logs, model_verdicts
from sibylla.simulator.policies import Oracle, VerdictPolicy
from sibylla.simulator.scheduler import simulate
from sibylla.simulator.synthetic import generate, servers_for_load
from tests.simulator.fixtures import CORPUS, KeywordClassifier


def test_a_classifier_that_is_always_right_matches_the_oracle():
    jobs = generate(2000, seed=5)
    classifier = KeywordClassifier()
    verdicts = model_verdicts(classifier, corpus_logs(jobs, CORPUS, seed=1), batch=100)
    failing = [j for j in jobs if j.outcome in ("deterministic", "nondeterministic")]
    assert set(verdicts) == {j.job_id for j in failing}
    assert max(classifier.batches) == 100
    servers = servers_for_load(jobs, 8, 0.6)
    model = measure(simulate(jobs, VerdictPolicy(verdicts, 3), servers))
    oracle = measure(simulate(jobs, Oracle(3), servers))
    assert (model.success_rate, model.futile_retry_gpu_h) == (
        oracle.success_rate,
        oracle.futile_retry_gpu_h,
    )


def test_a_corpus_missing_a_class_is_refused():
    with pytest.raises(ValueError, match="no nondeterministic logs"):
        corpus_logs(generate(500, seed=1), CORPUS[:1])


def test_generated_logs_carry_each_jobs_category():
    pytest.importorskip("sibylla.inference.synthetic")
    jobs = [j for j in generate(400, seed=3) if j.outcome == "deterministic"][:20]
    logs = generated_logs(jobs, seed=2)
    assert set(logs) == {j.job_id for j in jobs}
    assert all(log.strip() for log in logs.values())
