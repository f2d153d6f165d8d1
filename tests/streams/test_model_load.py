"""A worker loads its model in a process of its own, with the forward-pass threads it is told,
from the moment its first group join begins."""

from __future__ import annotations

import os
from concurrent.futures import Future
from pathlib import Path

import pytest

from sibylla.inference.api import LogWindow
from sibylla.inference.remote import ProcessClassifier
from sibylla.settings import Settings
from sibylla.streams import worker
from sibylla.streams.app import build_app
from sibylla.streams.worker import load_in_background, load_on_first_join


def test_the_model_runs_in_a_process_of_its_own_with_the_configured_cpu_threads() -> None:
    # Its forward passes then never wait for the worker's interpreter lock (finding 17 of
    # docs/pipeline-bench.md). The threads setting holds in that process (the default, 1: a
    # second thread spun beside the event loop on a 2-core box and cost ~2.5 ms of CPU per
    # decision at 100 failures/s).
    into: Future = Future()
    load_in_background(Settings(cpu_threads=2, device="cpu"), into)
    classifier = into.result(timeout=120)
    try:
        assert isinstance(classifier, ProcessClassifier)
        assert classifier.pid not in (None, os.getpid())
        assert (classifier.device, classifier.threads) == ("cpu", 2)
        lines = ["Traceback (most recent call last):", "SyntaxError: invalid syntax"]
        [prediction] = classifier.predict([LogWindow("job", 0, lines, lines, 2)])
        assert prediction.category == "syntax_error"
    finally:
        classifier.close()


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
