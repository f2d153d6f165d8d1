"""Effective Training Time Ratio (ETTR) of a checkpointed job under random failures.

Model: the job needs ``work`` hours of progress; it writes a checkpoint after every
``interval`` hours of progress, which takes ``write`` hours; failures strike as a Poisson process
of rate lambda = N_nodes * r_f at any moment (while training, writing or restarting); after one,
it spends ``restart`` hours (requeue, reload, warm-up) and resumes from the last checkpoint.
ETTR is progress over wall time (Kokolis et al., HPCA 2025, use the same ratio).

Derivation. Let a = interval + write. A segment finishes when a stretch of length a passes
without a failure. The expected time lost per try is E[min(T, a)] = (1 - e^{-la}) / l, and a
restart that must itself survive R hours takes (e^{lR} - 1) / l on average, so the expected
wall time per segment X satisfies X = (1 - e^{-la})/l + (1 - e^{-la}) ((e^{lR} - 1)/l + X),
i.e. X = e^{lR} (e^{la} - 1) / l   (Daly, FGCS 2006, reaches the same form).
ETTR = interval / X exactly for a job of many segments. To first order in l,
X ~ a (1 + l (R + a/2)), hence

    ETTR ~ interval / (interval + write) * (1 - l (restart + (interval + write) / 2)),

the checkpoint overhead times the share of time not lost to failures, each failure costing a
restart plus half a segment of rework on average. Maximising it gives Young's interval
sqrt(2 write / l) when write << interval << 1/l. The approximation is checked against
:func:`monte_carlo`, a direct simulation of the same model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

__all__ = [
    "CheckpointModel",
    "approximate",
    "exact",
    "monte_carlo",
    "optimal_interval",
    "young_interval",
]

_GOLDEN = (math.sqrt(5) - 1) / 2


@dataclass(frozen=True, slots=True)
class CheckpointModel:
    """Hours throughout; ``failure_rate`` is per hour for the whole job (N_nodes * r_f / 24)."""

    failure_rate: float
    interval: float
    write: float
    restart: float

    def __post_init__(self) -> None:
        if self.failure_rate < 0 or self.interval <= 0 or self.write < 0 or self.restart < 0:
            raise ValueError("need failure_rate, write, restart >= 0 and interval > 0")


def approximate(m: CheckpointModel) -> float:
    """First-order ETTR (see the module docstring); floored at 0."""
    a = m.interval + m.write
    return max(0.0, m.interval / a * (1 - m.failure_rate * (m.restart + a / 2)))


def exact(m: CheckpointModel) -> float:
    """ETTR of the model for a job of many segments."""
    a = m.interval + m.write
    lam = m.failure_rate
    if lam == 0:
        return m.interval / a
    segment = math.exp(lam * m.restart) * math.expm1(lam * a) / lam
    return m.interval / segment


def young_interval(failure_rate: float, write: float) -> float:
    """Young's optimal checkpoint interval sqrt(2 write / lambda) (Young, CACM 1974)."""
    return math.inf if failure_rate <= 0 else math.sqrt(2 * write / failure_rate)


def optimal_interval(failure_rate: float, write: float, restart: float) -> float:
    """Interval that maximises :func:`exact`, by golden-section search (ETTR is unimodal)."""
    if failure_rate <= 0 or write <= 0:
        return math.inf
    guess = young_interval(failure_rate, write)
    lo, hi = guess / 20, guess * 20

    def value(x: float) -> float:
        return exact(CheckpointModel(failure_rate, x, write, restart))

    x1, x2 = hi - _GOLDEN * (hi - lo), lo + _GOLDEN * (hi - lo)
    f1, f2 = value(x1), value(x2)
    while hi - lo > 1e-9 * guess:
        if f1 < f2:
            lo, x1, f1 = x1, x2, f2
            x2 = lo + _GOLDEN * (hi - lo)
            f2 = value(x2)
        else:
            hi, x2, f2 = x2, x1, f1
            x1 = hi - _GOLDEN * (hi - lo)
            f1 = value(x1)
    return (lo + hi) / 2


def monte_carlo(
    m: CheckpointModel, work: float, replicas: int = 2000, seed: int = 0
) -> tuple[float, float]:
    """ETTR = work / mean wall time over ``replicas`` simulated jobs, and its standard error.

    Each step draws the time to the next failure for every unfinished replica (memorylessness
    makes a fresh draw valid) and either completes the current phase (a segment of progress plus
    its checkpoint write, or a restart) or loses it.
    """
    rng = np.random.default_rng(seed)
    wall = np.zeros(replicas)
    done = np.zeros(replicas)
    restarting = np.zeros(replicas, dtype=bool)
    active = np.ones(replicas, dtype=bool)
    lam = m.failure_rate
    while active.any():
        idx = np.flatnonzero(active)
        gap = rng.exponential(1 / lam, idx.size) if lam > 0 else np.full(idx.size, np.inf)
        progress = np.minimum(m.interval, work - done[idx])
        need = np.where(restarting[idx], m.restart, progress + m.write)
        survived = gap >= need
        wall[idx] += np.where(survived, need, gap)
        done[idx] += np.where(survived & ~restarting[idx], progress, 0.0)
        restarting[idx] = ~survived
        active[idx] = done[idx] < work * (1 - 1e-12)
    mean_wall = wall.mean()
    stderr = work * wall.std(ddof=1) / math.sqrt(replicas) / mean_wall**2
    return work / mean_wall, stderr
