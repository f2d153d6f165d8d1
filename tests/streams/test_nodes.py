"""Suspect nodes: the ones failures of many distinct jobs blame."""

from __future__ import annotations

from sibylla.schemas.records import Decision
from sibylla.streams.nodes import blame_by_node


def _decision(job: str, attempt: int, rule: str, nodes: list[str]) -> Decision:
    return Decision(job, attempt, "nondeterministic", 0.99, "gpu_hardware_error",
                    "retry_elsewhere", nodes, [], "m", 1.0, 1.0, rule=rule)


def test_nodes_are_ranked_by_the_distinct_jobs_that_blamed_them() -> None:
    blamed = blame_by_node([
        _decision("a", 0, "hardware_blamed", ["gpu07"]),
        _decision("a", 1, "hardware_blamed", ["gpu07"]),
        _decision("a", 1, "hardware_blamed", ["gpu07"]),  # replayed: counted once
        _decision("b", 0, "not_job_fault", ["gpu07", "gpu02"]),
        _decision("c", 0, "hardware_blamed", ["gpu02"]),
        _decision("d", 0, "hardware_blamed", ["gpu02"]),
        # Sent elsewhere because of a network category, with no evidence against the node.
        _decision("e", 0, "transient_elsewhere", ["gpu09"]),
    ])
    assert [(b.node, len(b.jobs), b.attempts) for b in blamed] == [
        ("gpu02", 3, 3), ("gpu07", 2, 3)]
