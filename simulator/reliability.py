"""Failure rate per node-day from job events, with an exact confidence interval, and MTTF.

Meta's study of two A100 research clusters (Kokolis et al., "Revisiting Reliability in
Large-Scale Machine Learning Research Clusters", HPCA 2025) models a job's mean time to failure
as MTTF = 1 / (N_nodes * r_f), r_f being infrastructure failures per node-day (about 6.5e-3 on
their larger cluster). Here r_f is counted from the scheduler's job events: exposure is the
node-time of attempts between their started and finished events, failures the attempts that
ended in a state that blames the infrastructure. The interval is Garwood's exact Poisson interval,
which stays honest when only a handful of failures have been seen.

:class:`FailureRateEstimator` is pure and cheap so that the streaming worker can feed it every
job event and export the rate and MTTF as metrics.
"""

from __future__ import annotations

import datetime as dt
import math
from collections import OrderedDict
from collections.abc import Iterable

from sibylla.schemas.records import JobEvent

__all__ = [
    "DAY_S",
    "INFRA_STATES",
    "META_RSC1_RF",
    "FailureRateEstimator",
    "event_seconds",
    "gamma_quantile",
    "mttf_hours",
    "nodes_for",
    "poisson_interval",
]

DAY_S = 86_400.0
# Kokolis et al. (HPCA 2025): about 6.5 failures per 1,000 node-days on RSC-1.
META_RSC1_RF = 6.5e-3
# Job states that blame the infrastructure rather than the job (schemas/records.py's states).
INFRA_STATES = frozenset({"NODE_FAIL"})
_EPS = 1e-14


def nodes_for(gpus: int, gpus_per_node: int = 8) -> int:
    """Nodes a job of ``gpus`` GPUs spans when packed on whole nodes."""
    return max(1, -(-gpus // gpus_per_node))


def mttf_hours(gpus: int, rate_per_node_day: float, gpus_per_node: int = 8) -> float:
    """MTTF = 1 / (N_nodes * r_f), in hours (infinite when the rate is 0)."""
    per_day = nodes_for(gpus, gpus_per_node) * rate_per_node_day
    return math.inf if per_day <= 0 else 24.0 / per_day


def _gamma_p(a: float, x: float) -> float:
    """Regularized lower incomplete gamma P(a, x): series below a+1, continued fraction above."""
    if x <= 0:
        return 0.0
    log_front = -x + a * math.log(x) - math.lgamma(a)
    if x < a + 1:
        term = total = 1.0 / a
        ap = a
        while abs(term) > abs(total) * _EPS:
            ap += 1
            term *= x / ap
            total += term
        return min(1.0, total * math.exp(log_front))
    b = x + 1 - a
    c, d = 1e300, 1.0 / b
    h = d
    i = 0
    while True:
        i += 1
        an = -i * (i - a)
        b += 2
        d = an * d + b
        d = 1.0 / (d if abs(d) > 1e-300 else 1e-300)
        c = b + an / c
        c = c if abs(c) > 1e-300 else 1e-300
        h *= d * c
        if abs(d * c - 1) < _EPS or i > 10_000:
            break
    return max(0.0, 1.0 - math.exp(log_front) * h)


def gamma_quantile(p: float, shape: float) -> float:
    """x with P(Gamma(shape, 1) <= x) = p, by bisection (monotone, so it always converges)."""
    if not 0 < p < 1 or shape <= 0:
        raise ValueError("need 0 < p < 1 and shape > 0")
    lo, hi = 0.0, shape + 10 * math.sqrt(shape) + 10
    while _gamma_p(shape, hi) < p:
        lo, hi = hi, hi * 2
    for _ in range(200):
        mid = (lo + hi) / 2
        if _gamma_p(shape, mid) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-12 * max(1.0, hi):
            break
    return (lo + hi) / 2


def poisson_interval(
    failures: int, exposure: float, confidence: float = 0.95
) -> tuple[float, float, float]:
    """Rate estimate and Garwood's exact interval for ``failures`` seen over ``exposure``."""
    if exposure <= 0:
        return (math.nan, 0.0, math.inf)
    alpha = 1 - confidence
    lo = 0.0 if failures == 0 else gamma_quantile(alpha / 2, failures) / exposure
    hi = gamma_quantile(1 - alpha / 2, failures + 1) / exposure
    return failures / exposure, lo, hi


def event_seconds(ts: float | str | None, default: float) -> float:
    """Epoch seconds of a JobEvent timestamp (number or RFC 3339), ``default`` when unusable."""
    if ts is None:
        return default
    if isinstance(ts, (int, float)):
        return float(ts)
    try:
        stamp = dt.datetime.fromisoformat(ts)
    except ValueError:
        return default
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=dt.UTC)
    return stamp.timestamp()


class FailureRateEstimator:
    """Counts node-days of exposure and infrastructure failures from job events.

    Feed every event with ``observe(event, now)``; events without a timestamp are taken to happen
    at ``now``. Repeated events (at-least-once delivery) are ignored. An attempt still running
    counts its exposure up to ``now`` when the rate is read, capped at ``max_attempt_s`` so that a
    lost finished event cannot dilute the rate forever. A failure whose started event was never
    seen still counts (the failure is certain; its exposure is not known).
    """

    def __init__(
        self,
        gpus_per_node: int = 8,
        infra_states: Iterable[str] = INFRA_STATES,
        confidence: float = 0.95,
        max_attempt_s: float = 30 * DAY_S,
        remember: int = 65_536,
    ) -> None:
        self.gpus_per_node = gpus_per_node
        self.infra_states = frozenset(infra_states)
        self.confidence = confidence
        self.max_attempt_s = max_attempt_s
        self.failures = 0
        self._closed_node_s = 0.0
        self._open: dict[tuple[str, int], tuple[float, int]] = {}  # key -> (start, nodes)
        self._done: OrderedDict[tuple[str, int], None] = OrderedDict()
        self._remember = remember

    def _nodes(self, event: JobEvent) -> int:
        if event.nodes:
            return len(set(event.nodes))
        return nodes_for(event.gpus, self.gpus_per_node) if event.gpus > 0 else 0

    def observe(self, event: JobEvent, now: float) -> None:
        key = (event.job_id, event.attempt)
        if key in self._done:
            return
        at = event_seconds(event.ts, now)
        if event.event == "started":
            self._open.setdefault(key, (at, self._nodes(event)))
            return
        start, nodes = self._open.pop(key, (at, self._nodes(event)))
        self._closed_node_s += nodes * min(max(at - start, 0.0), self.max_attempt_s)
        if event.state in self.infra_states:
            self.failures += 1
        self._done[key] = None
        if len(self._done) > self._remember:
            self._done.popitem(last=False)

    def node_days(self, now: float) -> float:
        """Exposure so far, including attempts still running at ``now``."""
        running = sum(
            nodes * min(max(now - start, 0.0), self.max_attempt_s)
            for start, nodes in self._open.values()
        )
        return (self._closed_node_s + running) / DAY_S

    def rate_per_node_day(self, now: float) -> tuple[float, float, float]:
        """(estimate, lower, upper) of r_f; NaN estimate until some exposure was seen."""
        return poisson_interval(self.failures, self.node_days(now), self.confidence)

    def mttf_hours(self, n_nodes: int, now: float) -> float:
        """Projected MTTF of a job spanning ``n_nodes`` nodes at the estimated rate."""
        rate = self.rate_per_node_day(now)[0]
        if math.isnan(rate):
            return math.nan
        return mttf_hours(n_nodes * self.gpus_per_node, rate, self.gpus_per_node)
