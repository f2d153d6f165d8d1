"""``sibylla nodes``: nodes that failures of many jobs blame (suspect "lemon" nodes).

One broken GPU or NIC fails every job that lands on it, and each of those jobs looks like a
transient failure on its own. Counting, per node, the distinct jobs whose decisions blamed it
(a GPU fault line naming it, or the node dying under the job: rules ``hardware_blamed`` and
``not_job_fault``) shows the machine behind them. Workers export the same count as the
``sibylla_node_blames_total`` metric; this command reads it back from the decisions topic, so
it covers every worker and survives their restarts.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from dataclasses import dataclass, field

import orjson

from sibylla.schemas.records import Decision
from sibylla.settings import Settings
from sibylla.streams.follow import follow_decisions
from sibylla.streams.policy import BLAMING_RULES

__all__ = ["NodeBlame", "blame_by_node", "print_nodes"]


@dataclass
class NodeBlame:
    """What the decisions say against one node."""

    node: str
    jobs: set[str] = field(default_factory=set)
    attempts: int = 0
    last_at: float = 0.0
    categories: set[str] = field(default_factory=set)


def blame_by_node(decisions: Iterable[Decision]) -> list[NodeBlame]:
    """Blamed nodes, the most-blamed (by distinct jobs) first."""
    nodes: dict[str, NodeBlame] = {}
    seen: set[tuple[str, int]] = set()
    for d in decisions:
        if d.rule not in BLAMING_RULES or (d.job_id, d.attempt) in seen:
            continue
        seen.add((d.job_id, d.attempt))  # a replayed decision counts once
        for node in d.avoid_nodes:
            blame = nodes.setdefault(node, NodeBlame(node))
            blame.jobs.add(d.job_id)
            blame.attempts += 1
            blame.last_at = max(blame.last_at, d.decided_at)
            blame.categories.add(d.category)
    return sorted(nodes.values(), key=lambda b: (-len(b.jobs), -b.attempts, b.node))


async def print_nodes(settings: Settings, as_json: bool, show_all: bool) -> int:
    """Print the suspects (or every blamed node); exit status 0."""
    blamed = blame_by_node([d async for d in follow_decisions(settings, True, 2.0)])
    threshold = settings.nodes_suspect_jobs
    out = sys.stdout
    if not as_json:
        out.write(f"{'node':<24} {'jobs':>5} {'attempts':>8}  suspect  categories\n")
    for b in blamed:
        suspect = len(b.jobs) >= threshold
        if not (suspect or show_all):
            continue
        if as_json:
            out.write(orjson.dumps({"node": b.node, "jobs": len(b.jobs), "attempts": b.attempts,
                                    "last_at": b.last_at, "suspect": suspect,
                                    "categories": sorted(b.categories)}).decode() + "\n")
        else:
            out.write(f"{b.node:<24} {len(b.jobs):>5} {b.attempts:>8}  "
                      f"{'yes' if suspect else 'no':<7}  {','.join(sorted(b.categories))}\n")
    return 0
