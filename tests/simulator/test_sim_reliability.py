"""r_f, its interval, MTTF and the estimator the streaming worker feeds."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sibylla.schemas.records import JobEvent
from sibylla.simulator.reliability import (
    DAY_S,
    META_RSC1_RF,
    FailureRateEstimator,
    mttf_hours,
    poisson_interval,
)


@pytest.mark.parametrize(
    ("gpus", "published_h", "rounding"), [(16_384, 1.8, 0.05), (131_072, 0.23, 0.005)]
)
def test_mttf_reproduces_the_published_points(gpus, published_h, rounding):
    # The paper prints two significant figures: agree to within half of the last digit.
    assert mttf_hours(gpus, META_RSC1_RF, gpus_per_node=8) == pytest.approx(
        published_h, abs=rounding
    )


def test_mttf_halves_when_the_job_doubles():
    assert mttf_hours(2048, 1e-2) == pytest.approx(2 * mttf_hours(4096, 1e-2))
    assert mttf_hours(4, 1e-2) == mttf_hours(8, 1e-2)  # a partial node is still a node


@pytest.mark.parametrize(
    ("failures", "lo", "hi"),
    [(0, 0.0, 3.689), (1, 0.0253, 5.572), (10, 4.795, 18.39), (100, 81.36, 121.63)],
)
def test_poisson_interval_matches_the_exact_tables(failures, lo, hi):
    est, got_lo, got_hi = poisson_interval(failures, 1.0)
    assert est == failures
    assert got_lo == pytest.approx(lo, rel=1e-3, abs=1e-4)
    assert got_hi == pytest.approx(hi, rel=1e-3)


@given(st.integers(0, 5000), st.floats(0.1, 1e6))
def test_interval_brackets_the_estimate_and_narrows_with_exposure(failures, exposure):
    est, lo, hi = poisson_interval(failures, exposure)
    assert lo <= est <= hi
    _, lo4, hi4 = poisson_interval(failures * 4, exposure * 4)
    assert hi4 - lo4 <= hi - lo


def ev(job, event, ts, state=None, nodes=2, attempt=0):
    return JobEvent(
        job, attempt, event, state, None, None, tuple(f"n{i}" for i in range(nodes)), nodes * 8, ts
    )


def test_estimator_counts_node_days_and_infrastructure_failures():
    est = FailureRateEstimator()
    est.observe(ev("a", "started", 0.0, nodes=4), now=0)
    est.observe(ev("b", "started", 0.0, nodes=2), now=0)
    est.observe(ev("a", "finished", DAY_S, "NODE_FAIL", nodes=4), now=DAY_S)
    est.observe(ev("b", "finished", DAY_S, "FAILED", nodes=2), now=DAY_S)  # the job's own fault
    assert est.node_days(DAY_S) == pytest.approx(6.0)
    rate, lo, hi = est.rate_per_node_day(DAY_S)
    assert rate == pytest.approx(1 / 6)
    assert lo < rate < hi
    assert est.mttf_hours(n_nodes=1, now=DAY_S) == pytest.approx(144.0)


def test_estimator_ignores_redelivered_events_and_counts_running_attempts():
    est = FailureRateEstimator()
    for _ in range(3):
        est.observe(ev("a", "started", 0.0), now=0)
    assert est.node_days(DAY_S / 2) == pytest.approx(1.0)  # 2 nodes, half a day, still running
    for _ in range(2):
        est.observe(ev("a", "finished", DAY_S, "NODE_FAIL"), now=DAY_S)
    assert est.failures == 1
    assert est.node_days(10 * DAY_S) == pytest.approx(2.0)


def test_estimator_reads_rfc3339_and_missing_timestamps():
    est = FailureRateEstimator()
    est.observe(ev("a", "started", "2026-01-01T00:00:00Z", nodes=1), now=0)
    end = ev("a", "finished", None, "NODE_FAIL", nodes=1)
    est.observe(end, now=1767225600.0 + DAY_S)  # 2026-01-02T00:00:00Z
    assert est.node_days(0) == pytest.approx(1.0)
    assert est.rate_per_node_day(0)[0] == pytest.approx(1.0)


def test_estimator_without_exposure_reports_no_rate():
    est = FailureRateEstimator()
    assert math.isnan(est.rate_per_node_day(0)[0])
    assert math.isnan(est.mttf_hours(8, 0))


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 10),  # start, hours
            st.integers(1, 48),  # run time, hours
            st.integers(1, 4),  # nodes
            st.sampled_from(["COMPLETED", "FAILED", "NODE_FAIL"]),
        ),
        min_size=1,
        max_size=20,
    ),
    st.randoms(use_true_random=False),
)
def test_redelivery_and_reordering_do_not_change_the_rate(attempts, rng):
    events = []
    for i, (start, run, nodes, state) in enumerate(attempts):
        events.append(ev(f"j{i}", "started", start * 3600.0, nodes=nodes))
        events.append(ev(f"j{i}", "finished", (start + run) * 3600.0, state, nodes=nodes))
    once = FailureRateEstimator()
    for e in events:
        once.observe(e, now=0)
    # At-least-once delivery: some events twice; jobs interleaved (each job's own order kept).
    shuffled = FailureRateEstimator()
    noisy = [e for e in events for _ in range(rng.choice([1, 2]))]
    for i in rng.sample(range(len(attempts)), len(attempts)):
        for e in noisy:
            if e.job_id == f"j{i}":
                shuffled.observe(e, now=0)
    end = 100 * 3600.0
    assert shuffled.failures == once.failures == sum(a[3] == "NODE_FAIL" for a in attempts)
    assert shuffled.node_days(end) == pytest.approx(once.node_days(end))
    expected = sum(run * nodes for _, run, nodes, _ in attempts) / 24
    assert once.node_days(end) == pytest.approx(expected)
