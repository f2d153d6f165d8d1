"""ETTR: the approximation, the exact renewal formula and a Monte Carlo of the same model."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sibylla.simulator.ettr import (
    CheckpointModel,
    approximate,
    exact,
    monte_carlo,
    optimal_interval,
    young_interval,
)
from sibylla.simulator.reliability import META_RSC1_RF, mttf_hours

MINUTE = 1 / 60


@pytest.mark.parametrize(
    ("gpus", "interval_min", "write_min", "restart_min"),
    [(1_024, 30, 1, 10), (4_096, 20, 2, 5), (16_384, 5, 0.5, 2), (512, 120, 5, 15)],
)
def test_approximation_agrees_with_monte_carlo_when_failures_are_rare(
    gpus, interval_min, write_min, restart_min
):
    lam = 1 / mttf_hours(gpus, META_RSC1_RF)
    m = CheckpointModel(lam, interval_min * MINUTE, write_min * MINUTE, restart_min * MINUTE)
    assert lam * (m.interval + m.write + m.restart) < 0.1  # rare compared with a segment
    simulated, stderr = monte_carlo(m, work=100 * m.interval, replicas=1000, seed=1)
    assert approximate(m) == pytest.approx(simulated, rel=0.03)
    assert exact(m) == pytest.approx(simulated, abs=4 * stderr + 1e-9)


def test_exact_formula_holds_even_when_failures_are_frequent():
    m = CheckpointModel(failure_rate=1 / 0.5, interval=0.5, write=0.05, restart=0.2)
    simulated, stderr = monte_carlo(m, work=50, replicas=1000, seed=2)
    assert exact(m) == pytest.approx(simulated, abs=4 * stderr)
    assert approximate(m) < 0.9 * simulated  # first order is no longer enough here


def test_without_failures_only_the_checkpoint_writes_cost():
    m = CheckpointModel(0.0, interval=1.0, write=0.25, restart=1.0)
    assert exact(m) == approximate(m) == 0.8
    assert monte_carlo(m, work=10, replicas=10)[0] == pytest.approx(0.8)


@settings(max_examples=40, deadline=None)
@given(
    st.floats(0.01, 2.0),  # failures per hour
    st.floats(0.1, 10.0),  # checkpoint write, minutes
    st.floats(0.0, 30.0),  # restart, minutes
)
def test_optimal_interval_beats_its_neighbours(lam, write_min, restart_min):
    write, restart = write_min * MINUTE, restart_min * MINUTE
    best = optimal_interval(lam, write, restart)

    def value(x):
        return exact(CheckpointModel(lam, x, write, restart))

    assert value(best) >= value(best * 0.9)
    assert value(best) >= value(best * 1.1)


def test_young_interval_is_near_the_optimum_for_cheap_checkpoints():
    lam = 1 / mttf_hours(16_384, META_RSC1_RF)
    best = optimal_interval(lam, 0.5 * MINUTE, 0.0)
    assert young_interval(lam, 0.5 * MINUTE) == pytest.approx(best, rel=0.05)


def test_longer_restarts_and_bigger_jobs_lower_ettr():
    def at_best(gpus, restart_min):
        lam = 1 / mttf_hours(gpus, META_RSC1_RF)
        write, restart = 2 * MINUTE, restart_min * MINUTE
        return exact(CheckpointModel(lam, optimal_interval(lam, write, restart), write, restart))

    assert at_best(1_024, 10) > at_best(16_384, 10) > at_best(131_072, 10)
    assert at_best(16_384, 5) > at_best(16_384, 30)
