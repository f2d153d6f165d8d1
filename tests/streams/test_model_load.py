"""A worker loads its model in a thread of its own, with the forward-pass threads it is told."""

from __future__ import annotations

import threading
from concurrent.futures import Future

import torch

from sibylla.settings import Settings
from sibylla.streams.worker import load_in_background


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
