"""A worker loads its model in a thread of its own, with the forward-pass threads it is told,
from the moment its first group join begins."""

from __future__ import annotations

import threading
from concurrent.futures import Future
from pathlib import Path

import pytest
import torch

from sibylla.settings import Settings
from sibylla.streams import worker
from sibylla.streams.app import build_app
from sibylla.streams.worker import load_in_background, load_on_first_join


def test_the_model_runs_with_the_configured_cpu_threads_in_any_thread() -> None:
    # The micro-batcher runs the model in a thread of its own, not the one that loaded it:
    # the setting must hold there. (The default, 1: a second thread spun beside the event
    # loop on a 2-core box and cost ~2.5 ms of CPU per decision at 100 failures/s.)
    before = torch.get_num_threads()
    wanted = 2 if before == 1 else 1
    into: Future = Future()
    try:
        load_in_background(Settings(cpu_threads=wanted, device="cpu"), into)
        classifier = into.result(timeout=120)
        seen: Future = Future()
        threading.Thread(target=lambda: seen.set_result(torch.get_num_threads())).start()
        assert seen.result(timeout=10) == wanted
        assert classifier.device.type == "cpu"
    finally:
        torch.set_num_threads(before)


def test_the_load_begins_with_the_first_group_join_and_only_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Begun with the process, torch's import slowed faust's start and so the join (~0.9 s of
    # the first decision on Tansu); begun at the join, it overlaps the broker's hold of it.
    loads: list[Future] = []
    monkeypatch.setattr(worker, "load_in_background", lambda settings, into: loads.append(into))
    settings = Settings(data_dir=tmp_path)
    app = build_app(settings).app
    into: Future = Future()
    load_on_first_join(app, settings, into)
    assert loads == []
    app.on_rebalance_start()  # faust calls it before the consumer's JoinGroup request
    app.on_rebalance_start()  # a later rebalance: the model is loaded or loading already
    assert loads == [into]
