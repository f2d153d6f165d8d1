"""Retry policies side by side on one world: what each saves and what each loses."""

from __future__ import annotations

import pytest

from sibylla.simulator.confusion import ConfusionMatrix
from sibylla.simulator.metrics import measure
from sibylla.simulator.policies import ConfusionPolicy, FixedRetries, NeverRetry, Oracle
from sibylla.simulator.scheduler import simulate
from sibylla.simulator.synthetic import generate, servers_for_load

PERFECT = ConfusionMatrix.from_numbers("1,0,0,1")
ABSTAINS = ConfusionMatrix.from_numbers("0,0,1,0,0,1")


@pytest.fixture(scope="module")
def world():
    jobs = generate(3000, seed=7)
    return jobs, servers_for_load(jobs, 8, 0.6)


def run(world, policy):
    jobs, servers = world
    return measure(simulate(jobs, policy, servers, seed=3))


def test_fixed_retries_give_deterministic_failures_every_retry(world):
    jobs, servers = world
    result = simulate(jobs, FixedRetries(3), servers)
    counts = {}
    for a in result.attempts:
        counts[a.job] = counts.get(a.job, 0) + 1
    assert all(counts[i] == 4 for i, j in enumerate(jobs) if j.outcome == "deterministic")
    assert all(counts[i] == 1 for i, j in enumerate(jobs) if j.outcome in ("pass", "killed"))


def test_oracle_saves_the_futile_retries_without_losing_a_job(world):
    fixed, oracle = run(world, FixedRetries(3)), run(world, Oracle(3))
    assert oracle.success_rate == fixed.success_rate
    assert oracle.futile_retry_gpu_h < 0.2 * fixed.futile_retry_gpu_h
    assert oracle.mean_jct_h < fixed.mean_jct_h


def test_never_retrying_loses_the_transient_failures(world):
    never, fixed = run(world, NeverRetry()), run(world, FixedRetries(3))
    assert never.futile_retry_gpu_h == 0
    assert never.success_rate < fixed.success_rate


def test_sibylla_with_a_perfect_classifier_is_the_oracle(world):
    perfect = run(world, ConfusionPolicy(PERFECT, 3))
    oracle = run(world, Oracle(3))
    assert (perfect.success_rate, perfect.futile_retry_gpu_h, perfect.mean_jct_h) == (
        oracle.success_rate,
        oracle.futile_retry_gpu_h,
        oracle.mean_jct_h,
    )


def test_sibylla_that_always_abstains_is_the_default_policy(world):
    abstains = run(world, ConfusionPolicy(ABSTAINS, 3))
    fixed = run(world, FixedRetries(3))
    assert (abstains.futile_retry_gpu_h, abstains.mean_jct_h) == (
        fixed.futile_retry_gpu_h,
        fixed.mean_jct_h,
    )


def test_sibylla_wrongly_blocking_transient_failures_costs_success(world):
    blocks_all = ConfusionPolicy(ConfusionMatrix.from_numbers("1,0,1,0"), 3)
    assert run(world, blocks_all).success_rate == run(world, NeverRetry()).success_rate


def test_verdicts_are_the_same_on_every_replay():
    policy = ConfusionPolicy(ConfusionMatrix.from_numbers("5,3,2,2,6,2"), 3, seed=1)
    jobs = generate(200, seed=2)
    failing = [(i, j) for i, j in enumerate(jobs) if j.outcome == "nondeterministic"]
    first = [policy.verdict(i, j, 0) for i, j in failing]
    assert first == [policy.verdict(i, j, 0) for i, j in failing]
    assert len(set(first)) > 1


def _memory(matrix):
    from sibylla.simulator.policies import MemoryPolicy
    from sibylla.simulator.scheduler import attempt_outcome

    return MemoryPolicy(matrix, lambda job, n: attempt_outcome(job, n, 3, 0.8)[0], 3)


def test_memory_stops_an_unsure_deterministic_failure_when_it_recurs(world):
    """Unsure on every attempt, memoryless Sibylla falls back to fixed retries; with memory a
    deterministic failure dies at the same point again and the job stops after one retry."""
    jobs, servers = world
    result = simulate(jobs, _memory(ABSTAINS), servers, seed=3)
    counts: dict[int, int] = {}
    for a in result.attempts:
        counts[a.job] = counts.get(a.job, 0) + 1
    assert all(counts[i] == 2 for i, j in enumerate(jobs) if j.outcome == "deterministic")
    memoryless = run(world, ConfusionPolicy(ABSTAINS, 3, per_job=True))
    memory = measure(result)
    assert memory.futile_retry_gpu_h < 0.5 * memoryless.futile_retry_gpu_h
    assert memory.success_rate >= memoryless.success_rate - 0.01


def test_per_job_verdicts_repeat_on_later_attempts():
    policy = ConfusionPolicy(ConfusionMatrix.from_numbers("5,3,2,2,6,2"), 3, seed=1,
                             per_job=True)
    jobs = generate(200, seed=2)
    failing = [(i, j) for i, j in enumerate(jobs) if j.outcome in ("deterministic",
                                                                  "nondeterministic")]
    assert all(policy.verdict(i, j, 0) == policy.verdict(i, j, 2) for i, j in failing)
