"""Readiness from faust's rebalance and recovery state, step by step (the real broker test,
tests/integration/test_readiness.py, cannot stop a worker in the middle of a recovery)."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import Any

from faust.types import TP

from sibylla.streams.readiness import Readiness


class Signal:
    def __init__(self) -> None:
        self.receivers: list[Any] = []

    def connect(self, fn: Any) -> None:
        self.receivers.append(fn)

    def send(self) -> None:
        for fn in self.receivers:
            asyncio.run(fn(self))


def fake_app(assigned: set[TP]) -> Any:
    return SimpleNamespace(
        rebalancing_count=0, rebalancing=False, in_recovery=False,
        on_rebalance_complete=Signal(),
        tables=SimpleNamespace(recovery=SimpleNamespace(completed=asyncio.Event())),
        assignor=SimpleNamespace(assigned_actives=lambda: assigned))


def test_ready_only_after_the_latest_rebalance_recovered_with_partitions() -> None:
    assigned: set[TP] = set()
    app = fake_app(assigned)
    readiness = Readiness(app, "sibylla.logs", lambda: True)
    assert readiness.state().reason == "waiting for the first partition assignment"

    app.rebalancing_count, app.rebalancing = 1, True  # the group hands out partitions
    assert readiness.state().reason.startswith("rebalancing")
    app.rebalancing, app.in_recovery = False, True  # changelogs are replayed
    assert readiness.state().reason.startswith("rebalancing")  # recovery not completed yet
    assigned |= {TP("sibylla.logs", 2), TP("sibylla.logs", 0), TP("t-changelog", 0)}
    app.in_recovery = False
    app.tables.recovery.completed.set()
    app.on_rebalance_complete.send()
    state = readiness.state()
    assert (state.ready, state.partitions) == (True, [0, 2])
    assert state.ready_after_s is not None

    app.rebalancing_count += 1  # another worker joins: not ready until it completes
    assert not readiness.state().ready
    assigned.clear()
    app.on_rebalance_complete.send()
    state = readiness.state()
    assert not state.ready and "no partitions assigned" in state.reason


def test_a_recovery_in_progress_is_not_ready() -> None:
    app = fake_app({TP("sibylla.logs", 0)})
    readiness = Readiness(app, "sibylla.logs", lambda: True)
    app.rebalancing_count = 1
    app.on_rebalance_complete.send()
    assert readiness.state().reason == "recovering tables from their changelogs"
    app.tables.recovery.completed.set()
    app.in_recovery = True
    assert readiness.state().reason == "recovering tables from their changelogs"
    app.in_recovery = False
    assert readiness.state().ready


def recovered_while_the_model_loads(partition: int) -> tuple[Readiness, Any]:
    """A worker whose partition is assigned and recovered; ``model.loaded`` flips the load."""
    app = fake_app({TP("sibylla.logs", partition)})
    model = SimpleNamespace(loaded=False)
    readiness = Readiness(app, "sibylla.logs", lambda: model.loaded)
    app.rebalancing_count = 1
    app.tables.recovery.completed.set()
    app.on_rebalance_complete.send()
    return readiness, model


def test_not_ready_while_the_model_loads() -> None:
    readiness, model = recovered_while_the_model_loads(1)
    state = readiness.state()
    assert (state.ready, state.reason, state.ready_after_s) == (False, "loading the model", None)
    model.loaded = True
    state = readiness.state()
    assert (state.ready, state.partitions) == (True, [1])
    assert state.ready_after_s is not None


def test_the_moment_the_model_arrives_is_when_it_became_ready() -> None:
    readiness, model = recovered_while_the_model_loads(0)
    readiness.time_if_ready()  # told while the model still loads: not ready yet
    assert readiness.ready_after_s is None
    model.loaded = True
    readiness.time_if_ready()  # the worker's task, once the model is in
    timed = readiness.ready_after_s
    assert timed is not None
    time.sleep(0.05)
    assert readiness.state().ready_after_s == timed  # not re-timed by the first question
