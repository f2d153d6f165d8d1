"""Small traces for the simulator tests (by hand or by hypothesis) and a stand-in classifier."""

from __future__ import annotations

from hypothesis import strategies as st

from sibylla.inference.api import Prediction
from sibylla.simulator.jobs import Job

HOUR = 3600.0


def job(
    i: int, submit_h: float, gpus: int, hours: float, outcome: str = "pass", fail_h: float = 0.0
) -> Job:
    return Job(f"j{i}", submit_h * HOUR, gpus, hours * HOUR, outcome, fail_h * HOUR)  # type: ignore[arg-type]


@st.composite
def traces(draw: st.DrawFn, max_gpus: int = 8, max_jobs: int = 25) -> list[Job]:
    """Jobs with random sizes, outcomes and (often coinciding) submit times, in submit order."""
    n = draw(st.integers(1, max_jobs))
    jobs = []
    for i in range(n):
        outcome = draw(st.sampled_from(["pass", "killed", "deterministic", "nondeterministic"]))
        duration = draw(st.integers(1, 20)) * 0.5
        fail = (
            draw(st.integers(1, 10)) * 0.25
            if outcome in ("deterministic", "nondeterministic")
            else 0.0
        )
        jobs.append(
            job(
                i,
                draw(st.integers(0, 20)) * 0.5,
                draw(st.integers(1, max_gpus)),
                duration,
                outcome,
                fail,
            )
        )
    return sorted(jobs, key=lambda j: j.submit)


CORPUS = [
    {
        "label": "deterministic",
        "category": "syntax_error",
        "log": "epoch 1\nTraceback (most recent call last):\nSyntaxError: invalid syntax",
    },
    {
        "label": "nondeterministic",
        "category": "",
        "log": "step 10\nNCCL WARN Watchdog caught collective operation timeout",
    },
]


class KeywordClassifier:
    """Stands in for the shipped model: reads the window the stream would have kept."""

    version = "keyword-test"

    def __init__(self):
        self.batches = []

    def predict(self, windows):
        self.batches.append(len(windows))
        return [
            Prediction(
                "deterministic"
                if any("SyntaxError" in line for line in w.first_error)
                else "nondeterministic",
                0.9,
                "",
                [],
            )
            for w in windows
        ]
