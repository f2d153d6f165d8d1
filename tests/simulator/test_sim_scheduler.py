"""The replay's invariants: no GPU double-booked, every job ends once, GPU time conserved."""

from __future__ import annotations

from collections import defaultdict

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sibylla.simulator.confusion import ASSUMED
from sibylla.simulator.metrics import measure
from sibylla.simulator.policies import ConfusionPolicy, FixedRetries, NeverRetry, Oracle
from sibylla.simulator.scheduler import SimResult, simulate
from tests.simulator.fixtures import HOUR, job, traces

POLICIES = st.sampled_from(
    [FixedRetries(0), FixedRetries(2), NeverRetry(), Oracle(2), ConfusionPolicy(ASSUMED, 2)]
)


def peak_use(result: SimResult) -> dict[int, int]:
    """Most GPUs ever taken at once on each server (releases count before starts at a tie)."""
    changes: dict[int, list[tuple[float, int]]] = defaultdict(list)
    for a in result.attempts:
        for server, taken in a.allocation:
            changes[server] += [(a.start, taken), (a.end, -taken)]
    peaks = {}
    for server, events in changes.items():
        in_use = peak = 0
        for _, delta in sorted(events, key=lambda e: (e[0], e[1])):
            in_use += delta
            peak = max(peak, in_use)
        peaks[server] = peak
    return peaks


@settings(max_examples=60, deadline=None)
@given(traces(), POLICIES, st.integers(1, 3), st.sampled_from([4, 8]))
def test_no_gpu_is_double_booked(jobs, policy, servers, per_server):
    jobs = [j for j in jobs if -(-j.gpus // per_server) <= servers]
    if not jobs:
        return
    result = simulate(jobs, policy, servers, per_server)
    assert all(peak <= per_server for peak in peak_use(result).values())
    for a in result.attempts:
        assert sum(taken for _, taken in a.allocation) == a.gpus == jobs[a.job].gpus
        assert len({server for server, _ in a.allocation}) == len(a.allocation)


@settings(max_examples=60, deadline=None)
@given(traces(), POLICIES)
def test_every_job_ends_exactly_once(jobs, policy):
    result = simulate(jobs, policy, servers=2, gpus_per_server=8)
    by_job = defaultdict(list)
    for a in result.attempts:
        by_job[a.job].append(a)
    assert set(by_job) == set(range(len(jobs)))
    for i, attempts in by_job.items():
        attempts.sort(key=lambda a: a.number)
        assert [a.number for a in attempts] == list(range(len(attempts)))
        assert all(a.result == "failed" for a in attempts[:-1])  # only the last may succeed
        assert result.status[i] == attempts[-1].result
        assert result.finished[i] == attempts[-1].end
        assert attempts[0].enqueued == jobs[i].submit
        for before, after in zip(attempts, attempts[1:], strict=False):
            assert after.enqueued == before.end  # a retry queues when the failure is seen
        assert all(a.start >= a.enqueued for a in attempts)


@settings(max_examples=60, deadline=None)
@given(traces(), POLICIES)
def test_gpu_time_is_conserved(jobs, policy):
    result = simulate(jobs, policy, servers=2, gpus_per_server=8)
    attempts_gpu_h = sum(a.gpus * (a.end - a.start) for a in result.attempts) / HOUR
    per_server_gpu_h = (
        sum(taken * (a.end - a.start) for a in result.attempts for _, taken in a.allocation) / HOUR
    )
    assert per_server_gpu_h == pytest.approx(attempts_gpu_h)
    assert measure(result).busy_gpu_h == pytest.approx(attempts_gpu_h)
    for a in result.attempts:  # each attempt ran exactly as long as the job model says
        j = jobs[a.job]
        if j.outcome in ("pass", "killed"):
            assert a.end - a.start == pytest.approx(j.duration)
        elif j.outcome == "deterministic" or a.number == 0:
            assert a.end - a.start == pytest.approx(j.fail_after)


def test_head_of_queue_keeps_its_reservation_while_short_jobs_backfill():
    jobs = [
        job(0, 0, 2, 10),  # holds half the server until t=10
        job(1, 1, 4, 1),  # needs the whole server: reserved for t=10
        job(2, 2, 1, 5),  # fits now and ends by t=10: backfills
        job(3, 3, 1, 50),  # fits now but would delay job 1: waits
    ]
    result = simulate(jobs, NeverRetry(), servers=1, gpus_per_server=4)
    starts = {a.job: a.start / HOUR for a in result.attempts}
    assert starts == {0: 0, 1: 10, 2: 2, 3: 11}


def test_a_multi_server_job_takes_whole_servers():
    result = simulate([job(0, 0, 12, 1)], NeverRetry(), servers=3, gpus_per_server=8)
    assert sorted(t for _, t in result.attempts[0].allocation) == [4, 8]


def test_a_job_larger_than_the_cluster_is_refused():
    with pytest.raises(ValueError, match="cluster is smaller"):
        simulate([job(0, 0, 32, 1)], NeverRetry(), servers=2, gpus_per_server=8)


def test_a_batch_arriving_at_once_is_measured_until_it_drains():
    jobs = [job(0, 0, 4, 2), job(1, 0, 4, 1)]
    metrics = measure(simulate(jobs, NeverRetry(), servers=1, gpus_per_server=4))
    assert metrics.utilization == pytest.approx(1.0)  # 3 h of work on 4 GPUs over 3 h
    assert metrics.mean_queue_h == pytest.approx(1.0)  # one of the two waited 2 h
